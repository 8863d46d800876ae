"""Keep one worker process alive: restart it when it dies, kill it when its job stalls.

MLX on Metal used to abort the whole process on a command-buffer error, so the worker is treated as
disposable. The supervisor never imports MLX; it watches the worker from outside, through Redis.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time

import redis

from tasks.settings import Settings
from tasks.store import Store, connect

logger = logging.getLogger(__name__)

CHECK_S = 0.5


class Supervisor:
    def __init__(self, settings: Settings, command: list[str] | None = None) -> None:
        self.settings = settings
        self.command = command or [sys.executable, "-m", "worker.main"]
        self.store = Store(connect(settings.effective_redis_url), settings)
        self.stopping = threading.Event()

    def run(self) -> None:
        """Run the worker until asked to stop; restart it (with backoff when it dies young)."""
        backoff = 0.2
        while not self.stopping.is_set():
            started = time.monotonic()
            child = subprocess.Popen(self.command)
            logger.info("worker process %d started", child.pid)
            self._watch(child)
            if self.stopping.is_set():
                self._stop(child)
                return
            lived = time.monotonic() - started
            backoff = 0.2 if lived > 10 else min(backoff * 2, 10.0)
            logger.warning("worker process %d exited (%s) after %.1f s; restarting in %.1f s",
                           child.pid, child.returncode, lived, backoff)  # fmt: skip
            self._count_restart()
            self.stopping.wait(backoff)

    def _watch(self, child: subprocess.Popen[bytes]) -> None:
        """Return when the child exits, or after killing it because its job stalled."""
        while child.poll() is None and not self.stopping.wait(CHECK_S):
            try:
                stalled = self.store.fail_if_stalled()
            except redis.RedisError:
                continue
            if stalled:
                logger.error("job %s made no progress for %.0f s: ended failed (stalled); killing worker %d",
                             stalled, self.settings.stall_s, child.pid)  # fmt: skip
                child.kill()
                child.wait()

    def _stop(self, child: subprocess.Popen[bytes]) -> None:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    def _count_restart(self) -> None:
        try:
            self.store.count("worker_restarts")
        except redis.RedisError:
            pass


def run(settings: Settings) -> None:
    supervisor = Supervisor(settings)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: supervisor.stopping.set())
    supervisor.run()
