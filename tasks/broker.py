"""The dramatiq side of the contract: one broker, one GPU queue, one actor name.

A message carries only a job id. It means "a job was admitted: run the next one". The worker then claims
the next job from Redis in fair order (start-time fair queuing across users), which is usually, but not
always, the job named. Because each admitted job sends one message and each message runs at most one job,
duplicate or late deliveries are harmless: a claim that finds nothing waiting does nothing.

dramatiq's Redis consumer polls with a backoff of up to its timeout, which adds up to that much to every
pickup. Here the consumer instead blocks on a wake-up list that every enqueue (and every ack, so the next
message is fetched as soon as the worker is free) pushes to: pickup in about a millisecond, and an idle
worker costs Redis one blocking command per idle timeout.
"""

from __future__ import annotations

import dramatiq
from typing import Any

import redis
from dramatiq.errors import ConnectionClosed
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.message import Message
from dramatiq.middleware import Retries, ShutdownNotifications, TimeLimit

from tasks import keys
from tasks.settings import Settings

QUEUE_NAME = "onelane-gpu"
ACTOR_NAME = "run_next"
NAMESPACE = "onelane-dramatiq"


WAKE_TTL_S = 3600


class WakingRedisBroker(RedisBroker):
    """dramatiq's Redis broker, whose consumers wait on a wake-up list instead of polling."""

    @property
    def consumer_class(self) -> type[_RedisConsumer]:
        return _WakingConsumer

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        message = super().enqueue(message, delay=delay)
        self.wake(message.queue_name)
        return message

    def wake(self, queue_name: str) -> None:
        """Tell a consumer blocked on `queue_name` to look for a message now."""
        with self.client.pipeline(transaction=False) as pipe:
            pipe.rpush(keys.wake(queue_name), 1)
            pipe.expire(keys.wake(queue_name), WAKE_TTL_S)
            pipe.execute()


class _WakingConsumer(_RedisConsumer):  # type: ignore[misc]
    woken = False

    def __next__(self) -> Any:
        if self.message_cache:
            return super().__next__()
        wake = keys.wake(self.queue_name)
        try:
            # Clear the wake-ups first, then look: an enqueue after the look leaves a wake-up for the wait.
            # Right after a wake-up, look at once: whatever enqueue comes next leaves a wake-up of its own.
            if not self.woken:
                self.broker.client.delete(wake)
            self.woken = False
            if self.outstanding_message_count < self.prefetch:
                self.message_cache = self.broker.do_fetch(
                    self.queue_name, self.prefetch - self.outstanding_message_count
                )
                if self.message_cache:
                    return super().__next__()
            self.woken = self.broker.client.blpop([wake], timeout=self.timeout / 1000) is not None
            return None
        except redis.ConnectionError as exc:
            raise ConnectionClosed(exc) from None

    def ack(self, message: Any) -> None:
        super().ack(message)
        self.broker.wake(self.queue_name)  # the worker is free: fetch the next message now


def make_broker(settings: Settings, worker: bool = True) -> RedisBroker:
    """The broker; for the worker with GPU-safe middleware: no retries, an explicit time limit, no age limit.

    The web only sends messages and needs no middleware (dramatiq's time-limit and shutdown middleware also
    refuse to start under gevent, which the web server uses).
    """
    middleware = (
        [TimeLimit(time_limit=int(settings.job_time_limit_s * 1000)), ShutdownNotifications(), Retries(max_retries=0)]
        if worker
        else []
    )
    broker = WakingRedisBroker(url=settings.effective_redis_url, namespace=NAMESPACE, middleware=middleware)
    broker.declare_queue(QUEUE_NAME)
    return broker


def send_run_next(broker: dramatiq.Broker, job_id: str) -> None:
    """Ring the worker's doorbell for an admitted job (the web never imports the worker's actor)."""
    broker.enqueue(dramatiq.Message(queue_name=QUEUE_NAME, actor_name=ACTOR_NAME, args=(job_id,), kwargs={}, options={}))
