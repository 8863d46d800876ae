"""The lease keeper: a small process beside a worker that renews the worker's device lease where nothing in the
worker can keep it from doing so (a native call holding the interpreter, a machine so busy that the heartbeat thread
waits seconds for it), and stops renewing it as soon as the worker is gone, stopped, or hung.

Started by the worker (worker/keeper_link.py) at a higher priority where the system allows it, never a lower one.
It imports Redis's client and the standard library only, and reads what it needs on its standard input: one line of
JSON (the Redis URL, the device, the worker's id and pid, the lease, how long the worker may show no life, the
script tasks/lua/keep_lease.lua as Redis runs it), then a byte each time the worker's heartbeat thread runs.

The fencing rule, at each renewal (every third of the lease): the lease is renewed only if it is still this worker's
(never taken back once lapsed), the worker's process is alive and not stopped or traced (/proc/PID/stat), and its
heartbeat thread ran within `hung_s`. So a worker killed, or whose standard input closed, loses its lease within
the lease; one stopped (SIGSTOP) within the lease as well; one whose interpreter stays held within hung_s + lease; a
merely busy or starved one keeps it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import sys
import time
from dataclasses import dataclass

import redis

logger = logging.getLogger("worker.keeper")

PRIORITY_BOOST = 5  # niceness taken off, where the system allows it (root, or CAP_SYS_NICE)
STOPPED = frozenset("TtZXx")  # /proc/PID/stat states: stopped, traced, zombie, dead


@dataclass(frozen=True)
class Lease:
    """What the worker tells its keeper."""

    url: str
    device: str
    worker: str
    pid: int
    lease_ms: int
    hung_s: float
    script: str


def process_state(pid: int) -> str | None:
    """The state letter of the process `pid` (R, S, D, T, Z...), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def why_not(lease: Lease, alive_at: float) -> str | None:
    """Why the lease must not be renewed now (None: renew it)."""
    state = process_state(lease.pid)
    if state is None or os.getppid() != lease.pid:
        return "gone"
    if state in STOPPED:
        return f"stopped (state {state})"
    if time.monotonic() - alive_at > lease.hung_s:
        return f"hung: its heartbeat has not run for {time.monotonic() - alive_at:.0f} s"
    return None


def keep(lease: Lease, client: redis.Redis) -> str:
    """Renew the lease while the fencing rule allows; why it ended."""
    renew, every = client.register_script(lease.script), lease.lease_ms / 3000
    alive_at, due, told = time.monotonic(), 0.0, None
    while True:
        if select.select([0], [], [], max(due - time.monotonic(), 0))[0]:
            if not os.read(0, 4096):
                return "the worker closed its end"
            alive_at = time.monotonic()
            continue
        due = time.monotonic() + every
        reason = why_not(lease, alive_at)
        if reason == "gone":
            return "the worker is gone"
        if reason != told and reason is not None:
            logger.warning("keeper of worker %s: not renewing its lease: the worker is %s", lease.worker, reason)
        told = reason
        if reason is not None:
            continue
        try:
            reply = renew(keys=[], args=[lease.device, lease.worker, lease.lease_ms])
        except redis.RedisError as exc:  # the next round tries again; the heartbeat tells the worker's log
            logger.debug("keeper: renewal failed: %s", exc)
            continue
        if reply != b"ok":
            return "the lease lapsed"


def main() -> None:
    lease = Lease(**json.loads(sys.stdin.buffer.readline()))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with contextlib.suppress(OSError):  # not allowed: the worker's own priority
        os.nice(-PRIORITY_BOOST)
    timeout = lease.lease_ms / 3000
    client = redis.Redis.from_url(lease.url, socket_timeout=timeout, socket_connect_timeout=timeout)
    logger.debug("keeper of worker %s: %s", lease.worker, keep(lease, client))


if __name__ == "__main__":
    main()
