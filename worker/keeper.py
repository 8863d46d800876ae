"""The lease keeper: a small process beside a worker that renews the worker's device lease where nothing in the
worker can keep it from doing so (a native call holding the interpreter, a machine so busy that the heartbeat thread
waits seconds for it), and stops renewing it as soon as the worker is gone, stopped, or hung.

Started by the worker (worker/keeper_link.py) at a higher priority where the system allows it, never a lower one,
before the worker takes the device: its start (an interpreter, `import redis`) takes seconds on a starved machine,
and is paid while the worker waits, not while the lease rests on the worker's heartbeat alone. It imports Redis's
client and the standard library only, and reads what it needs on its standard input: one line of JSON (the Redis
URL, the device, the worker's id and pid, the lease, how long the worker may show no life, the script
tasks/lua/keep_lease.lua as Redis runs it), then HOLD once the worker holds the device (it renews at once, and from
then on), and a byte each time the worker's heartbeat thread runs. It writes READY on its standard output once it
can renew (started, connected, the script loaded), and nothing else there.

The fencing rule, at each renewal (every third of the lease): the lease is renewed only if it is still this worker's
(never taken back once lapsed), the worker's process is alive and not stopped or traced (/proc/PID/stat), and it
shows life: its heartbeat thread ran within a lease, or it is at work (one of its threads used BUSY_SHARE of a core
through the last lease: a native call computing with the interpreter held, a starved machine) and its heartbeat ran
within `hung_s`. So a worker killed, or whose
standard input closed, loses its lease within the lease; one stopped (SIGSTOP), or blocked with its interpreter held
(a read that never returns, a native deadlock: no CPU time), within two leases; one that computes with its
interpreter held for ever within hung_s + lease; a merely busy or starved one keeps it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field

import redis

logger = logging.getLogger("worker.keeper")

STOPPED = frozenset("TtZXx")  # /proc/PID/stat states: stopped, traced, zombie, dead
BUSY_SHARE = 0.05  # a thread using this share of a core, or more, computes (one waiting for the interpreter: ~0.5 %)
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
READY = b"r"  # (keeper -> worker) it can renew the lease
HOLD = b"h"  # (worker -> keeper) the worker holds the device: keep its lease from now on


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


def thread_ticks(pid: int) -> dict[int, int]:
    """The CPU time each thread of the process `pid` has used (clock ticks: user + system)."""
    ticks = {}
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{pid}/task/{task}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
                ticks[int(task)] = int(fields[11]) + int(fields[12])
    return ticks


@dataclass
class Life:
    """What the keeper has seen of its worker: when its heartbeat last ran, and its threads' CPU time over the last
    lease (sampled each round)."""

    alive_at: float
    window_s: float
    samples: deque[tuple[float, dict[int, int]]] = field(default_factory=deque)

    def at_work(self, pid: int) -> bool:
        """Whether one of the worker's threads computed through the last lease: used at least BUSY_SHARE of a core
        (a native call computing with the interpreter held; a starved machine still gives it that much). Threads
        that only wait for the interpreter use next to nothing; nor does one blocked in a call that never returns."""
        now, ticks = time.monotonic(), thread_ticks(pid)
        self.samples.append((now, ticks))
        while len(self.samples) > 1 and self.samples[1][0] <= now - self.window_s:
            self.samples.popleft()
        then, before = self.samples[0]
        if now - then < self.window_s:  # (not watched for a lease yet: as at work)
            return True
        most = max((t - before.get(tid, t) for tid, t in ticks.items()), default=0)
        return most >= BUSY_SHARE * (now - then) * TICKS_PER_S


def why_not(lease: Lease, life: Life) -> str | None:
    """Why the lease must not be renewed now (None: renew it)."""
    state = process_state(lease.pid)
    if state is None or os.getppid() != lease.pid:
        return "gone"
    if state in STOPPED:
        return f"stopped (state {state})"
    quiet = time.monotonic() - life.alive_at
    at_work = life.at_work(lease.pid)
    if quiet > lease.hung_s:
        return f"hung: its heartbeat has not run for {quiet:.0f} s"
    if quiet > life.window_s and not at_work:
        return f"hung: its heartbeat has not run for {quiet:.1f} s, and none of its threads computes"
    return None


def keep(lease: Lease, client: redis.Redis, held: bool = False) -> str:
    """Renew the lease once the worker holds it, while the fencing rule allows; why it ended. A renewal that fails
    (Redis slow or away) is tried again the next round; the first of a run of them is told, and so is a lease that
    lapsed meanwhile: the worker's log is where an operator reads why a worker lost its device."""
    renew, every = client.register_script(lease.script), lease.lease_ms / 3000
    life, due, told = Life(time.monotonic(), lease.lease_ms / 1000), 0.0, None
    # `held`: the worker holds the device (told by HOLD): until then there is nothing to renew
    renewed: float | None = None  # when it last renewed the lease (None: not yet)
    failing = False
    while True:
        if select.select([0], [], [], max(due - time.monotonic(), 0) if held else None)[0]:
            told_now = os.read(0, 4096)
            if not told_now:
                return "the worker closed its end"
            if not held and HOLD in told_now:  # renew at once; its life is watched from now on
                held, due, life = True, 0.0, Life(time.monotonic(), lease.lease_ms / 1000)
            life.alive_at = time.monotonic()
            continue
        due = time.monotonic() + every
        reason = why_not(lease, life)
        if reason == "gone":
            return "the worker is gone"
        if reason != told and reason is not None:
            logger.warning("keeper of worker %s: not renewing its lease: the worker is %s", lease.worker, reason)
        told = reason
        if reason is not None:
            continue
        try:
            reply = renew(keys=[], args=[lease.device, lease.worker, lease.lease_ms])
        except redis.RedisError as exc:  # the next round tries again
            if not failing:
                logger.warning("keeper of worker %s: renewal failed (trying again): %s", lease.worker, exc)
            failing = True
            continue
        if reply != b"ok":
            last = "before its first renewal" if renewed is None else f"{time.monotonic() - renewed:.1f} s after it"
            logger.warning("keeper of worker %s: the lease lapsed %s", lease.worker, last)
            return "the lease lapsed"
        renewed, failing = time.monotonic(), False


def main() -> None:
    # (in a process group of its own, it hears no terminal's Ctrl-C; should one reach it all the same, it ends when
    # its worker does: its end closes)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    lease, after = read_lease()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    timeout = lease.lease_ms / 3000
    client = redis.Redis.from_url(lease.url, socket_timeout=timeout, socket_connect_timeout=timeout)
    with contextlib.suppress(redis.RedisError):  # connected, the script loaded (else its first renewal does it)
        client.script_load(lease.script)
    with contextlib.suppress(OSError):  # (a worker gone meanwhile: its end closes, and the keeper ends)
        os.write(1, READY)
    logger.debug("keeper of worker %s: %s", lease.worker, keep(lease, client, held=HOLD in after))


def read_lease() -> tuple[Lease, bytes]:
    """The lease's line from standard input, and what came after it (HOLD, when a keeper is started again for a
    worker that holds the device), read unbuffered: what follows is read with os.read."""
    line = b""
    while b"\n" not in line:
        chunk = os.read(0, 65536)
        if not chunk:
            sys.exit(0)  # the worker ended before it told its lease
        line += chunk
    head, _, after = line.partition(b"\n")
    return Lease(**json.loads(head)), after


if __name__ == "__main__":
    main()
