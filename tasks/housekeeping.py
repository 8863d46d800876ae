"""Housekeeping, every second, wherever onelane runs: in every web process and in the worker.

A round (one script, see tasks/lua/housekeep.lua) ends waiting jobs that must not run (past their deadline, or
their watcher gone), puts back the jobs of a worker whose lease ended, and rings the worker's doorbell if jobs wait
and no message is pending. A lease that lapsed may have lapsed under a dead worker or under a late one (a starved
host): only a death counts as an attempt against its jobs, at once when its supervisor saw it die, else once it is
clear that the worker never woke. Then a model whose load killed (or hung) ONELANE_MAX_ATTEMPTS workers in a row
fails, with its waiting jobs (tasks/lua/failed_models.lua), so that a load that kills the worker does not hold them
until they expire (after fewer deaths, the next worker loads it again; a worker late in its load is not counted).
Because the web runs it too, a job expires on time while no worker holds the device (a crash loop, a model loading, the
worker stopped); running it in several processes at once is harmless, as each round is atomic.
"""

from __future__ import annotations

import logging

import redis
from dramatiq.brokers.redis import RedisBroker

from tasks.background import Background
from tasks.broker import Doorbell
from tasks.store import Store
from tasks.store.upkeep import ModelCheck

logger = logging.getLogger(__name__)


WHY = {
    "died": "its worker died",
    "late": "its worker's lease lapsed under a late heartbeat (it woke and stopped); not counted as an attempt",
    "lapsed": "its worker's lease lapsed; counted as an attempt at its next hand-back unless the worker wakes "
    "(a late heartbeat)",
}


def log_release(job_id: str, verdict: str) -> None:
    """Say what became of a running job whose worker lost its lease, and why (tasks/lua/housekeep.lua's verdict)."""
    outcome, _, was = verdict.partition(" ")
    logger.warning("job %s: %s; %s", job_id, WHY.get(was, "its worker died"), outcome)


LOAD_LAPSES = {
    "retry": "a worker died or hung while loading it",
    "late": "a worker's lease lapsed while it loaded it, and it woke (late, not dead: not counted)",
    "lapsed": "a worker's lease lapsed while it loaded it (counted once it is clear it never woke)",
}


def log_death(model: ModelCheck) -> None:
    """Say what a model's check found of a worker that left its load unfinished."""
    if model.verdict == "died":
        logger.warning(
            "model %s: its load killed ONELANE_MAX_ATTEMPTS workers in a row; failed, with %d waiting job(s) "
            "(model_unavailable)",
            model.name,
            model.n,
        )
    elif model.verdict in LOAD_LAPSES:
        logger.warning(
            "model %s: %s (%d in a row); the next worker loads it again",
            model.name,
            LOAD_LAPSES[model.verdict],
            model.n,
        )


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
            log_release(job_id, verdict)
        for model in self.store.upkeep.check_models():
            log_death(model)
        return waiting

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.round()
            except redis.RedisError as exc:  # Redis away: try again next round
                logger.warning("housekeeping failed: %s", exc)
