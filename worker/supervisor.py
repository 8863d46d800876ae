"""Keep the GPU worker alive: restart it when it dies, kill it when it freezes or its job stalls.

MLX on Metal used to abort the whole process on a command-buffer error, so worker processes are treated as
disposable. The supervisor keeps two: the active one holds the device's lease; a standby has done its slow
imports and waits for the lease. When the active one dies, the supervisor frees its lease at once, the
standby takes over (and loads the model), and a new standby is started. The supervisor never imports MLX;
it watches the workers from outside, through Redis.

A worker whose lease lapsed while it lived (its heartbeat came late: a starved host, or a hang) is killed as soon as
another worker holds the device, never later: two processes must never work on one GPU. Such a kill is not a death
(drop_lease.lua is told so): the runs its lapse handed back are counted only at their jobs' next hand-back, so a
late heartbeat costs a job one resumption from its tokens, and a job under which every worker hangs still fails.
While nobody holds the device, a worker that lost it has WAKE_S to notice by itself (tasks/lua/lease.lua marks it
late, and nothing is counted).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Literal, TypeVar

import redis

from tasks.quiet_start import start_service
from tasks.settings import ENV_NAMES, Settings
from tasks.stop_signals import stop_on_signals
from tasks.store import Store
from worker.blas import worker_env

logger = logging.getLogger(__name__)
T = TypeVar("T")

CHECK_S = 0.1  # how often dead children are reaped (no Redis involved)
WATCH_EVERY = 5  # look at the device in Redis every 5th check: 2 commands/s
WORKERS = 2  # the active one and a standby
STOP_MARGIN_S = 30.0  # a stopping worker's time beyond its drain: handing back, writing out, letting go of MLX
WAKE_S = 10.0  # how long a worker that lost the device may still run to notice it (3 leases, if longer)


class Supervisor:
    def __init__(self, settings: Settings, command: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        self.settings = settings
        self.command = command or [sys.executable, "-m", "worker.main", "--supervisor", str(os.getpid())]
        # The workers inherit our environment (the settings were read from it), with OpenBLAS preloaded, and log
        # at our level (which `onelane --log-level` may have set).
        self.env = {**worker_env(os.environ if env is None else env), ENV_NAMES["log_level"]: settings.log_level}
        self.store = Store.connect(settings)
        self.stopping = threading.Event()
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.spawned_at: dict[int, float] = {}
        self.held: set[int] = set()  # children seen holding the lease at some point
        self.holder: int | None = None  # our child seen holding the lease now
        self.lost: dict[int, float] = {}  # children seen losing the lease while alive, and when
        self.killed_lost: set[int] = set()  # children killed for it (their reap is not a death)
        self.died_at: float | None = None  # when the device last lost its holder
        self.backoff = 0.0  # grows only while workers die before ever holding the device (a crash loop)
        self.next_spawn = 0.0

    def run(self) -> None:
        """Supervise until asked to stop, then stop the workers."""
        try:
            tick = 0
            while not self.stopping.wait(CHECK_S):
                self._reap()
                if len(self.children) - len(self.lost) < WORKERS and time.monotonic() >= self.next_spawn:
                    self._spawn()
                tick += 1
                if tick % WATCH_EVERY == 0:
                    self._check_holder()
        finally:
            self._stop_children()

    def _stop_children(self) -> None:
        """Stop every worker in good order (the active one lets its batch drain, then hands back what still runs),
        then free the device at once for whoever comes next."""
        for child in self.children.values():
            child.send_signal(signal.SIGTERM)
            child.send_signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        for pid, child in self.children.items():
            try:
                child.wait(timeout=self.settings.drain_s + STOP_MARGIN_S)
            except subprocess.TimeoutExpired:
                logger.error(
                    "worker process %d did not stop within %.0f s: killing it",
                    pid,
                    self.settings.drain_s + STOP_MARGIN_S,
                )
                child.kill()
                child.wait()
            self._redis(lambda dead=pid: self.store.upkeep.drop_device(dead))

    def _spawn(self) -> None:
        child = start_service(self.command, env=self.env)
        self.children[child.pid] = child
        self.spawned_at[child.pid] = time.monotonic()
        logger.info("worker process %d started", child.pid)

    def _reap(self) -> None:
        """Forget dead children; free the device at once if a dead one holds it (seen or not)."""
        for pid, child in list(self.children.items()):
            if child.poll() is None:
                continue
            del self.children[pid]
            lived = time.monotonic() - self.spawned_at.pop(pid)
            log = logger.info if child.returncode == 0 else logger.warning  # 0: it stopped in good order
            log("worker process %d exited (%s) after %.1f s", pid, child.returncode, lived)
            self._redis(lambda: self.store.upkeep.count("worker_restarts"))
            died = pid not in self.killed_lost  # (one killed for losing the device was late or hung, not known)
            self.killed_lost.discard(pid)
            dropped = self._redis(lambda dead=pid: self.store.upkeep.drop_device(dead, died=died))
            if dropped or pid == self.holder:
                self.holder, self.died_at = None, time.monotonic()
            # A worker killed while working is replaced at once; one that dies before it ever held the device
            # is likely to die again (a bad model path, a broken install): back off, up to 10 s.
            if pid in self.held or dropped:
                self.held.discard(pid)
                self.backoff = 0.0
            else:
                self.backoff = min(max(self.backoff * 2, 0.2), 10.0)
            self.next_spawn = time.monotonic() + self.backoff

    def _check_holder(self) -> None:
        """Track which child holds the device; kill it if its job stalled, or one that lost the device and has not
        stopped by itself within its wake grace (frozen, not late)."""
        watched = self._redis(self.store.upkeep.watch_device)
        if watched is False:
            return
        pid, stalled = watched
        now = time.monotonic()
        if self.holder is not None and pid != self.holder:
            # alive but no longer holding the device: late (it exits at its next heartbeat), or frozen
            if self.holder in self.children:
                self.lost.setdefault(self.holder, now)
            self.holder, self.died_at = None, self.died_at or now
        self._kill_lost(now, taken=pid is not None and pid not in self.lost)
        if pid in self.children and pid != self.holder and pid not in self.lost:
            self.holder = pid
            self.held.add(pid)
            if self.died_at is not None:
                logger.info(
                    "worker process %d took the device %.2f s after the previous one was lost",
                    pid,
                    now - self.died_at,
                )
                self.died_at = None
        if self.holder is not None and pid == self.holder and stalled:
            logger.error(
                "jobs %s made no progress for %.0f s: ended failed (stalled); killing worker %d",
                ", ".join(stalled),
                self.settings.stall_s,
                self.holder,
            )
            self.children[self.holder].kill()

    def _kill_lost(self, now: float, taken: bool) -> None:
        """Kill the children that lost the device and still run: at once when another worker holds it (one process
        on a GPU, always), else once they have had WAKE_S to notice by themselves."""
        grace = max(WAKE_S, 3 * self.settings.lease_s)
        for pid, since in list(self.lost.items()):
            if pid not in self.children:
                del self.lost[pid]
            elif taken or now - since > grace:
                logger.warning(
                    "worker process %d lost the device %.1f s ago and still runs (late or hung): killing it, as %s",
                    pid,
                    now - since,
                    "another worker holds the device" if taken else "it did not notice",
                )
                self.children[pid].send_signal(signal.SIGKILL)
                self.killed_lost.add(pid)
                del self.lost[pid]

    # (Callable[..., T]: the lambdas it is given bind a loop variable as a default argument)
    def _redis(self, call: Callable[..., T]) -> T | Literal[False]:
        """Run a Redis call; False when Redis is away (the supervisor just tries again next round)."""
        try:
            return call()
        except redis.RedisError:
            return False


def run(settings: Settings) -> None:
    supervisor = Supervisor(settings)
    stop_on_signals(supervisor.stopping)
    supervisor.run()
