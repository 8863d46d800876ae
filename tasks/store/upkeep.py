"""Upkeep of the queue, whoever runs it: housekeeping rounds (every web process and the worker), the worker's
doorbell, the supervisor's look at its device, and the counters behind /metrics."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import redis

from tasks import keys
from tasks.broker import Doorbell
from tasks.scripts import Scripts, bell
from tasks.settings import Settings


@dataclass(frozen=True)
class FailedModel:
    """A model that may not be loaded now: it failed to load, and its retry time has not come."""

    name: str
    died: bool  # found just now: its worker died while loading it (and the model's waiting jobs failed with it)
    jobs_failed: int  # its waiting jobs failed just now


class Upkeep:
    """Upkeep verbs on `store`'s connection."""

    def __init__(self, client: redis.Redis, settings: Settings, scripts: Scripts) -> None:
        self.redis, self.settings, self.scripts = client, settings, scripts

    def housekeep(self, doorbell: Doorbell | None = None) -> tuple[int, list[tuple[str, str]]]:
        """One periodic round: end waiting jobs past their deadline (expired) or whose watcher left (client_gone),
        release running jobs whose worker lost its device (requeued at the front, or failed after max_attempts),
        and ring `doorbell` if jobs wait and no message is pending. Returns (jobs waiting, [(job id, verdict)])."""
        s = self.settings
        waiting, *flat = self.scripts.run(
            "housekeep",
            max_attempts=s.max_attempts,
            ttl_s=s.job_ttl_s,
            result_ttl_s=s.result_ttl_s,
            limit=500,
            **bell(doorbell),
        )
        return int(waiting), list(zip(flat[::2], flat[1::2]))

    def failed_models(self, names: Iterable[str] | None = None) -> list[FailedModel]:
        """Those of `names` (default: every model served) that failed to load and may not be tried yet; first, each
        one whose worker died while loading it is recorded failed, and its waiting jobs fail (model_unavailable)."""
        s = self.settings
        names = [m.name for m in s.catalog] if names is None else list(names)
        flat = self.scripts.run("failed_models", retry_s=s.model_retry_s, result_ttl_s=s.result_ttl_s, models=names)
        return [FailedModel(flat[i], flat[i + 1] == "died", int(flat[i + 2])) for i in range(0, len(flat), 3)]

    def ring(self, doorbell: Doorbell) -> bool:
        """Push the worker's doorbell unless one is pending; True if pushed."""
        return bool(self.scripts.run("ring", **bell(doorbell)))

    def drop_device(self, pid: int) -> bool:
        """Free this device if the process `pid` (known dead) holds it."""
        return bool(self.scripts.run("drop_lease", device=self.settings.device, field="pid", value=pid))

    def watch_device(self) -> tuple[int | None, list[str]]:
        """The pid holding this device, and the jobs ended as stalled (no progress for stall_s s) there."""
        s = self.settings
        pid, *stalled = self.scripts.run("stall", device=s.device, stall_s=s.stall_s, result_ttl_s=s.result_ttl_s)
        return (int(pid) if pid else None), stalled

    def count(self, field: str, n: int = 1) -> None:
        """Add to one of the counters behind /metrics."""
        self.redis.hincrby(keys.STATS, field, n)
