"""The dramatiq side of the contract: one broker, one GPU queue, one actor name.

A message carries only a job id. It means "a job was admitted: run the next one". The worker then claims
the next job from Redis in fair order (round-robin across users), which is usually, but not always, the
job named. Because each admitted job sends one message and each message runs at most one job, duplicate
or late deliveries are harmless: a claim that finds nothing waiting does nothing.
"""

from __future__ import annotations

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Retries, ShutdownNotifications, TimeLimit

from tasks.settings import Settings

QUEUE_NAME = "onelane-gpu"
ACTOR_NAME = "run_next"
NAMESPACE = "onelane-dramatiq"


def make_broker(settings: Settings) -> RedisBroker:
    """A Redis broker with GPU-safe middleware: no retries, an explicit time limit, no age limit."""
    broker = RedisBroker(
        url=settings.effective_redis_url,
        namespace=NAMESPACE,
        middleware=[
            TimeLimit(time_limit=int(settings.job_time_limit_s * 1000)),
            ShutdownNotifications(),
            Retries(max_retries=0),
        ],
    )
    broker.declare_queue(QUEUE_NAME)
    return broker


def send_run_next(broker: dramatiq.Broker, job_id: str) -> None:
    """Ring the worker's doorbell for an admitted job (the web never imports the worker's actor)."""
    broker.enqueue(dramatiq.Message(queue_name=QUEUE_NAME, actor_name=ACTOR_NAME, args=(job_id,), kwargs={}, options={}))
