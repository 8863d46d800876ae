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
class ModelCheck:
    """What a look at a model's load found: it failed to load and may not be tried yet (`blocked`), or a worker left
    its load unfinished just now and the next worker tries again (tasks/lua/failed_models.lua)."""

    name: str
    verdict: str  # 'failed' (earlier), 'died' (its load killed its max_attempts-th worker in a row: failed just now,
    #               with its waiting jobs); or tried again: 'retry' (its load killed a worker just now, fewer in a row),
    #               'late' (its worker lost its lease while loading, and woke: not counted), 'lapsed' (not known yet)
    n: int  # 'died': its waiting jobs failed just now; else the workers its load killed in a row

    @property
    def blocked(self) -> bool:
        return self.verdict in ("failed", "died")


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

    def check_models(self, names: Iterable[str] | None = None) -> list[ModelCheck]:
        """Those of `names` (default: every model served) that failed to load and may not be tried yet, and those
        whose worker left their load unfinished just now. A death there is counted (a lapse once its worker never
        woke): the load that killed ONELANE_MAX_ATTEMPTS workers in a row is recorded failed, and the model's waiting
        jobs fail (model_unavailable); after fewer, the next worker tries again (tasks/lua/failed_models.lua)."""
        s = self.settings
        names = [m.name for m in s.catalog] if names is None else list(names)
        flat = self.scripts.run(
            "failed_models",
            retry_s=s.model_retry_s,
            result_ttl_s=s.result_ttl_s,
            max_deaths=s.max_attempts,
            models=names,
        )
        return [ModelCheck(flat[i], flat[i + 1], int(flat[i + 2])) for i in range(0, len(flat), 3)]

    def ring(self, doorbell: Doorbell) -> bool:
        """Push the worker's doorbell unless one is pending; True if pushed."""
        return bool(self.scripts.run("ring", **bell(doorbell)))

    def drop_device(self, pid: int, died: bool = True) -> bool:
        """Free this device if the process `pid` (known gone) holds it; `died`: it died under its jobs (not killed by
        its supervisor for losing the device, which counts its lapsed runs only at their next hand-back)."""
        scripts = self.scripts
        return bool(scripts.run("drop_lease", device=self.settings.device, field="pid", value=pid, died=int(died)))

    def watch_device(self) -> tuple[int | None, list[str]]:
        """The pid holding this device, and the jobs ended as stalled (no progress for stall_s s) there."""
        s = self.settings
        pid, *stalled = self.scripts.run("stall", device=s.device, stall_s=s.stall_s, result_ttl_s=s.result_ttl_s)
        return (int(pid) if pid else None), stalled

    def count(self, field: str, n: int = 1) -> None:
        """Add to one of the counters behind /metrics."""
        self.redis.hincrby(keys.STATS, field, n)
