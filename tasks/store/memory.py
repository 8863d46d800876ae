"""What keeps Redis's memory within ONELANE_REDIS_MEMORY: new work is refused while Redis holds that much.

onelane sets no `maxmemory`: a Redis that evicts keys would lose jobs, and one that refuses writes would stop running
jobs from ending. Instead what adds to Redis from outside (a job admitted, a file uploaded, a batch created) is
refused with a 503 and Retry-After while Redis's `used_memory` is at the bound, and everything already in it goes on
and ends (its keys lapse, or go as what they describe ends: docs/operating.md). So Redis holds at most the bound,
plus what the running and waiting jobs still write (their outputs, each at most ONELANE_MAX_TOKENS_LIMIT tokens).

Redis's figure is read at most once every READ_EVERY_S a process (a burst of requests costs Redis one INFO a second),
and what this process adds meanwhile is counted on top of it, so a burst of uploads does not run past the bound while
the figure is a second old.
"""

from __future__ import annotations

import threading
import time

import redis

from tasks.errors import StorageFull

READ_EVERY_S = 1.0
RETRY_AFTER_S = 30  # what a refused client is told: ended jobs' records and images lapse over minutes


class MemoryGuard:
    """Refuses new work while Redis holds `bound` bytes or more (`check`)."""

    def __init__(self, client: redis.Redis, bound: int) -> None:
        self.redis, self.bound = client, bound
        self._lock = threading.Lock()
        self._used, self._read_at = 0, -READ_EVERY_S

    def used(self) -> int:
        """Redis's used_memory, as read within the last READ_EVERY_S."""
        with self._lock:
            if time.monotonic() - self._read_at >= READ_EVERY_S:
                self._used = int(self.redis.info("memory")["used_memory"])
                self._read_at = time.monotonic()
            return self._used

    def check(self, adding: int = 0) -> None:
        """StorageFull while Redis holds the bound or more; else `adding` bytes are counted as held from now on."""
        used = self.used()
        if used + adding > self.bound:
            raise StorageFull(
                "the server's store is full (ONELANE_REDIS_MEMORY); try again once older jobs and files have lapsed",
                retry_after_s=RETRY_AFTER_S,
            )
        with self._lock:
            self._used += adding
