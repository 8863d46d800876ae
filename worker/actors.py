"""The one actor: thin, takes a job id, hands the work to the runner."""

from __future__ import annotations

import logging

import dramatiq

from tasks.broker import ACTOR_NAME, QUEUE_NAME
from worker.runner import Runner

logger = logging.getLogger(__name__)


def declare(broker: dramatiq.Broker, runner: Runner, time_limit_ms: int) -> dramatiq.Actor:  # type: ignore[type-arg]
    """Declare `run_next` on `broker`: no retries (a retry could generate twice), an explicit time limit."""

    def run_next(job_id: str) -> None:
        job = runner.run_next()
        if job is None:
            logger.debug("message for %s: nothing left to run", job_id)

    return dramatiq.actor(
        run_next,
        actor_name=ACTOR_NAME,
        queue_name=QUEUE_NAME,
        broker=broker,
        max_retries=0,
        time_limit=time_limit_ms,
    )
