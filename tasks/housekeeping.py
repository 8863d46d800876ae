"""Housekeeping, every second, wherever onelane runs: in every web process and in the worker.

A round (one script, see tasks/lua/housekeep.lua) ends waiting jobs that must not run (past their deadline, or
their watcher gone), puts back the jobs of a worker that died, and rings the worker's doorbell if jobs wait
and no message is pending; then a model whose worker died while loading it fails, with its waiting jobs
(tasks/lua/failed_models.lua), so that a load that kills the worker does not hold them until they expire. Because
the web runs it too, a job expires on time while no worker holds the device (a crash loop, a model loading, the
worker stopped); running it in several processes at once is harmless, as each round is atomic.
"""

from __future__ import annotations

import logging

import redis
from dramatiq.brokers.redis import RedisBroker

from tasks.background import Background
from tasks.broker import Doorbell
from tasks.store import Store

logger = logging.getLogger(__name__)

INTERVAL_S = 1.0


class Housekeeper(Background):
    """Runs housekeeping rounds on a thread of its own until stopped."""

    name = "housekeeping"

    def __init__(self, store: Store, broker: RedisBroker, interval_s: float = INTERVAL_S) -> None:
        super().__init__()
        self.store = store
        self.broker = broker
        self.interval_s = interval_s

    def round(self) -> int:
        """One round now; returns how many jobs wait."""
        waiting, released = self.store.upkeep.housekeep(Doorbell.ring(self.broker, "housekeeping"))
        for job_id, verdict in released:
            logger.warning("job %s: its worker died; %s", job_id, verdict)
        for model in self.store.upkeep.failed_models():
            if model.died:
                logger.warning(
                    "model %s: its worker died while loading it; failed, with %d waiting job(s) (model_unavailable)",
                    model.name,
                    model.jobs_failed,
                )
        return waiting

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.round()
            except redis.RedisError as exc:  # Redis away: try again next round
                logger.warning("housekeeping failed: %s", exc)
