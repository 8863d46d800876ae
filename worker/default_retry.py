"""An idle worker tries its default model again once the model's failed load may be retried (ONELANE_MODEL_RETRY_S
after it failed), instead of waiting for a job to ask for it: so /readyz tells whether the model loads now, not what
it did a retry period ago, and a server whose model could not load (a download offline, a folder not there yet)
becomes ready by itself once the cause is gone."""

from __future__ import annotations

import logging
import threading

import redis

from tasks.store import WorkerStore
from worker.models import ModelPool

logger = logging.getLogger(__name__)

CHECK_S = 1.0  # how often the default model's record is looked at (one HMGET and a TIME)


def retry_default(models: ModelPool, store: WorkerStore, stopping: threading.Event) -> None:
    """Until `stopping`: load the default model again whenever its retry is due and nothing runs."""
    name = models.settings.model_name
    while not stopping.wait(CHECK_S):
        try:
            due = models.get_quietly(name) is None and store.model_retry_due(name)
        except redis.RedisError as exc:  # the next look tries again
            logger.debug("cannot read model %s's record: %s", name, exc)
            continue
        # the lock is free only while no batch runs (the runner holds it throughout); a job that comes meanwhile
        # waits for the load, as it would have loaded the model itself
        if due and models.lock.acquire(blocking=False):
            try:
                if models.get_quietly(name) is None:
                    logger.info("model %s: trying its load again", name)
                    models.load(name)
            except Exception:  # a load's own failures are recorded by it; anything else must not end the thread
                logger.exception("model %s: its load's retry failed", name)
            finally:
                models.lock.release()
