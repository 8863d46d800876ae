"""The one actor: thin, takes a doorbell, hands the work to the runner."""

from __future__ import annotations

import logging
import threading

import dramatiq

from tasks.broker import ACTOR_NAME, QUEUE_NAME
from worker.runner.loop import Runner

logger = logging.getLogger(__name__)


def declare(broker: dramatiq.Broker, runner: Runner, stopping: threading.Event) -> dramatiq.Actor[[str], None]:
    """Declare `run_next` on `broker`: no retries (a retry could generate twice), no time limit of its own (a
    message may run several jobs; each job has the runner's time limit)."""

    def run_next(job_id: str) -> None:
        if not runner.run_waiting(stopping):
            logger.debug("message for %s: nothing left to run", job_id)

    return dramatiq.actor(actor_name=ACTOR_NAME, queue_name=QUEUE_NAME, broker=broker, max_retries=0)(run_next)
