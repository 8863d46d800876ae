"""The worker's end of its lease keeper (worker/keeper.py): start it with what it needs to know, tell it the worker
lives each time the heartbeat thread runs, start it again if it died, and end it when the worker stops."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from tasks.scripts import source
from tasks.settings import Settings

logger = logging.getLogger(__name__)

KEEPER = Path(__file__).with_name("keeper.py")
STOP_S = 5.0  # how long a keeper told to end may take before it is killed
PRIORITY_BOOST = 5  # niceness taken off the keeper, where the system allows it (root, or CAP_SYS_NICE)


class KeeperLink:
    """The keeper of the lease that `worker` holds on the settings' device."""

    def __init__(self, settings: Settings, worker: str) -> None:
        self.settings, self.worker = settings, worker
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the keeper (isolated: it imports nothing of onelane's, whatever the working folder)."""
        s = self.settings
        lease = {
            "url": s.effective_redis_url,
            "device": s.device,
            "worker": self.worker,
            "pid": os.getpid(),
            "lease_ms": int(s.lease_s * 1000),
            "hung_s": s.lease_hung_s,
            "script": source("keep_lease"),
        }
        process = subprocess.Popen([sys.executable, "-I", str(KEEPER)], stdin=subprocess.PIPE)
        boost(process.pid)  # at once: on a starved machine its start alone took seconds, the heartbeat alone renewing
        assert process.stdin is not None
        process.stdin.write(json.dumps(lease).encode() + b"\n")  # (within a pipe's buffer: it does not wait)
        process.stdin.flush()
        os.set_blocking(process.stdin.fileno(), False)  # a keeper that does not read never holds the heartbeat up
        self.process = process

    def alive(self) -> None:
        """Tell the keeper the worker's interpreter runs; start it again if it crashed (one that ended because the
        lease lapsed is left ended: the heartbeat finds out and the worker stops)."""
        process = self.process
        if process is None or process.stdin is None:
            return
        if process.poll() is not None:
            if process.returncode != 0:
                logger.warning("the lease keeper ended (%s): starting it again", process.returncode)
                self.start()
            return
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(process.stdin.fileno(), b".")

    def stop(self) -> None:
        """End the keeper: its input closes, it stops renewing at once."""
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            process.stdin.close()  # type: ignore[union-attr]
        try:
            process.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def boost(keeper: int) -> None:
    """Run the process `keeper` at this (its worker's) priority and PRIORITY_BOOST more, where the system allows it;
    else it keeps the worker's."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, keeper, os.getpriority(os.PRIO_PROCESS, 0) - PRIORITY_BOOST)
