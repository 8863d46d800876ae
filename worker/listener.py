"""The worker's listener: a thread subscribed to Redis's pub/sub, so that what happens elsewhere reaches the batch
at once rather than at its next look: a running job's cancel (it stops before the next step), a stream opened on a
running job (its held tokens go out: worker/output.py), a queue move (a job may join the batch).

Apart from the worker process (worker/main.py), which starts it.
"""

from __future__ import annotations

import logging
import threading

import redis

from tasks import keys
from tasks.store import WorkerStore
from worker.runner.loop import Runner

logger = logging.getLogger(__name__)


def listen(jobs: WorkerStore, runner: Runner, down: threading.Event) -> None:
    """Hear cancels of running jobs the moment they happen, so a job stops before the next step; streams opened
    on running jobs, so their tokens are written as they come; and queue moves, so a job joins the batch the
    moment it can. Until `down` (the worker stopped); reconnects while Redis does not answer."""
    while not down.is_set():
        try:
            with jobs.listen() as sub:
                runner.queue_moved.set()  # (re)subscribed: something may have been missed
                while not down.is_set():
                    message = sub.get_message(timeout=1.0)
                    if message is None:
                        continue
                    if message["channel"] == keys.CANCELS:
                        runner.request_stop(message["data"])
                    elif message["channel"] == keys.LIVE:
                        runner.writer.go_live(message["data"])
                    else:
                        runner.queue_moved.set()
        except redis.RedisError as exc:  # the output writes still carry the flag meanwhile
            logger.warning("listener: %s; reconnecting", exc)
            down.wait(1.0)
