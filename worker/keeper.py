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
(never taken back once lapsed), the worker's process is alive and not stopped or traced (/proc/PID/stat), and it shows
life: its heartbeat thread ran within a lease, or it is at work and its heartbeat ran within `hung_s`. At work: through
the last lease one of its threads computed (used BUSY_SHARE of a core: a native call computing with the interpreter
held) or wanted to (it was runnable at each look, or its CPU time and its wait for a CPU, /proc/PID/task/TID/schedstat,
came to WANTING_SHARE of a core: a machine so busy that the worker gets next to no CPU). A keeper that was itself held a
whole lease (a machine that froze everyone) saw nothing it can judge by, and renews. So a worker killed, or whose
standard input closed, loses its lease within the lease; one stopped (SIGSTOP), or blocked with its interpreter held (a
read that never returns, a native deadlock: no CPU time, none wanted), within two leases; one that computes with its
interpreter held for ever within hung_s + lease; a merely busy or starved one keeps it. A keeper that stops renewing for
a hung worker says so on the worker's record (`hung`), for tasks/lua/failed_models.lua: a load that hung its worker is
the model's doing, a lease lost while the worker was late or stopped is not; and it signals the worker (SAY_WHERE),
whose faulthandler writes every thread's stack to its stderr: no Python code of it runs (a call holds its interpreter,
or it is blocked), so its frames hold still while they are read (a dump while its threads run again, as a starved
worker's do, can crash it).
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
WANTING_SHARE = 0.5  # a thread on a CPU or waiting for one this share of the time wants to compute (one waiting for
#                      the interpreter: under 1 % beside three busy processes; a starved one at SCHED_IDLE: ~46 %, and
#                      one given no CPU at all shows no wait, only that it is runnable at each look)
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
READY = b"r"  # (keeper -> worker) it can renew the lease
HOLD = b"h"  # (worker -> keeper) the worker holds the device: keep its lease from now on
SAY_WHERE = signal.SIGUSR1  # (keeper -> worker) it was found hung: write every thread's stack


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


@dataclass(frozen=True)
class Thread:
    """One thread of the worker, as the keeper samples it."""

    ran_s: float  # the CPU time it used
    waited_s: float  # the time it waited for a CPU while runnable, counted as it gets one (0 where not kept)
    runnable: bool  # it runs or waits for a CPU now (state R)


def threads(pid: int) -> dict[int, Thread]:
    """Each thread of the process `pid` (/proc/PID/task/TID/stat, and .../schedstat where the kernel keeps it)."""
    found = {}
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                found[int(task)] = _thread(f"/proc/{pid}/task/{task}")
    return found


def _thread(task: str) -> Thread:
    with open(f"{task}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    ran, waited = (int(fields[11]) + int(fields[12])) / TICKS_PER_S, 0.0
    with contextlib.suppress(FileNotFoundError):
        with open(f"{task}/schedstat", "rb") as schedstat:
            ran_ns, waited_ns = schedstat.read().split()[:2]
        ran, waited = int(ran_ns) / 1e9, int(waited_ns) / 1e9
    return Thread(ran, waited, fields[0] == b"R")


@dataclass
class Life:
    """What the keeper has seen of its worker: when its heartbeat last ran, and its threads over the last lease
    (sampled each round)."""

    alive_at: float
    window_s: float
    samples: deque[tuple[float, dict[int, Thread]]] = field(default_factory=deque)

    def at_work(self, pid: int) -> bool:
        """Whether one of the worker's threads computed through the last lease (used BUSY_SHARE of a core: a native
        call computing with the interpreter held), or wanted to (a starved machine: it was runnable at every look,
        or on a CPU or waiting for one WANTING_SHARE of the time), or the keeper cannot tell (it was itself held a
        whole lease: a machine that froze everyone). A thread that only waits for the interpreter, or one blocked in
        a call that never returns, uses and wants next to nothing, and sleeps at nearly every look."""
        now, seen = time.monotonic(), threads(pid)
        away = not self.samples or now - self.samples[-1][0] >= self.window_s
        self.samples.append((now, seen))
        while len(self.samples) > 1 and self.samples[1][0] <= now - self.window_s:
            self.samples.popleft()
        then, before = self.samples[0]
        if away or now - then < self.window_s:  # (not watched for a whole lease: as at work)
            return True
        window = now - then
        for tid, thread in seen.items():
            if tid not in before:
                continue
            ran = thread.ran_s - before[tid].ran_s
            wanted = ran + thread.waited_s - before[tid].waited_s
            always_runnable = all(tid in looked and looked[tid].runnable for _, looked in self.samples)
            if ran >= BUSY_SHARE * window or wanted >= WANTING_SHARE * window or always_runnable:
                return True
        return False


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
        return f"hung: its heartbeat has not run for {quiet:.1f} s, and none of its threads computes or waits to"
    return None


def keep(lease: Lease, client: redis.Redis, held: bool = False) -> str:
    """Renew the lease once the worker holds it, while the fencing rule allows; why it ended. A renewal that fails
    (Redis slow or away) is tried again the next round; the first of a run of them is told, and so is a lease that
    lapsed meanwhile: the worker's log is where an operator reads why a worker lost its device."""
    renew, every = client.register_script(lease.script), lease.lease_ms / 3000
    life, due, told = Life(time.monotonic(), lease.lease_ms / 1000), 0.0, None
    # `held`: the worker holds the device (told by HOLD): until then there is nothing to renew
    renewed: float | None = None  # when it last renewed the lease (None: not yet)
    failing = marked = False  # (marked: the worker's record says it hung, since this keeper last renewed)
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
            logger.warning(
                "keeper of worker %s: not renewing its lease: the worker is %s%s",
                lease.worker,
                reason,
                " (its threads' stacks: its stderr)" if reason.startswith("hung") and not marked else "",
            )
        told = reason
        if reason is not None and (marked or not reason.startswith("hung")):
            continue
        try:  # renew it, or record the worker hung (once)
            reply = renew(keys=[], args=[lease.device, lease.worker, lease.lease_ms, reason or ""])
        except redis.RedisError as exc:  # the next round tries again
            if not failing:
                logger.warning("keeper of worker %s: renewal failed (trying again): %s", lease.worker, exc)
            failing = True
            continue
        failing, marked = False, reply == b"hung"
        if marked:
            with contextlib.suppress(OSError):  # (gone meanwhile: nothing to say)
                os.kill(lease.pid, SAY_WHERE)
            continue
        if reply != b"ok":
            last = "before its first renewal" if renewed is None else f"{time.monotonic() - renewed:.1f} s after it"
            logger.warning("keeper of worker %s: the lease lapsed %s", lease.worker, last)
            return "the lease lapsed"
        renewed = time.monotonic()


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
