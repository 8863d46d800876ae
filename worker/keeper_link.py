"""The worker's end of its lease keeper (worker/keeper.py): start it with what it needs to know before the worker
takes the device and wait until it can renew, tell it when the worker holds the device, tell it the worker lives each
time the heartbeat thread runs, start it again if it died, and end it when the worker stops."""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import json
import logging
import os
import select
import subprocess
import sys
from pathlib import Path

from tasks.scripts import source
from tasks.settings import Settings
from worker.keeper import HOLD, READY, SAY_WHERE

logger = logging.getLogger(__name__)

KEEPER = Path(__file__).with_name("keeper.py")
STOP_S = 5.0  # how long a keeper told to end may take before it is killed
PRIORITY_BOOST = 5  # niceness taken off the keeper, where the system allows it (root, or CAP_SYS_NICE)
READY_S = 30.0  # how long the worker waits for its keeper to start before it takes the device without it


class KeeperLink:
    """The keeper of the lease that `worker` holds on the settings' device."""

    def __init__(self, settings: Settings, worker: str) -> None:
        self.settings, self.worker = settings, worker
        self.process: subprocess.Popen[bytes] | None = None
        self.holding = False  # the worker holds the device (its keeper was told)

    def start(self) -> None:
        """Start the keeper (isolated: it imports nothing of onelane's, whatever the working folder); one started
        again for a worker that holds the device renews at once."""
        say_where_when_hung()  # before the keeper can signal it: the signal's default would end the worker
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
        # a process group of its own: a terminal's Ctrl-C, sent to the worker's group, would end it mid-import (a
        # traceback in the worker's log) while the worker stops in good order; it ends when the worker's end closes
        process = subprocess.Popen(
            [sys.executable, "-I", str(KEEPER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, process_group=0
        )
        boost(process.pid)  # at once: on a starved machine its start alone takes seconds
        assert process.stdin is not None
        told = json.dumps(lease).encode() + b"\n" + (HOLD if self.holding else b"")
        process.stdin.write(told)  # (within a pipe's buffer: it does not wait)
        process.stdin.flush()
        os.set_blocking(process.stdin.fileno(), False)  # a keeper that does not read never holds the heartbeat up
        self.process = process

    def ready(self, within: float = READY_S) -> str | None:
        """Wait, `within` seconds at most, until the keeper can renew the lease (started, connected): None once it
        can, else why not (it may still, or be started again by the heartbeat, which renews meanwhile)."""
        process = self.process
        if process is None or process.stdout is None:
            return "it was not started"
        if not select.select([process.stdout], [], [], within)[0]:
            return f"it did not start within {within:g} s"
        if os.read(process.stdout.fileno(), 1) != READY:
            return f"it ended as it started (exit {process.poll()})"
        return None

    def hold(self) -> None:
        """Tell the keeper the worker holds the device now: it renews the lease at once, and from then on."""
        self.holding = True
        process = self.process
        if process is not None and process.stdin is not None:
            with contextlib.suppress(BlockingIOError, BrokenPipeError):  # (one that died is started again, told)
                os.write(process.stdin.fileno(), HOLD)

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
        for end in (process.stdin, process.stdout):
            if end is not None:
                with contextlib.suppress(OSError):
                    end.close()
        try:
            process.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@functools.cache
def say_where_when_hung() -> None:
    """Write every thread's stack to stderr when the keeper signals that it found this worker hung (faulthandler's
    handler, which needs no interpreter; it restarts a system call it interrupts). Nowhere to write them: to nowhere,
    so the signal never ends the worker."""
    try:
        faulthandler.register(SAY_WHERE, file=sys.__stderr__, all_threads=True)  # type: ignore[arg-type]  # (None: AttributeError)
    except (AttributeError, ValueError, OSError):  # no stderr, or not a file with a descriptor
        faulthandler.register(SAY_WHERE, file=open(os.devnull, "w"), all_threads=True)  # noqa: SIM115  # (for good)


def boost(keeper: int) -> None:
    """Run the process `keeper` at this (its worker's) priority and PRIORITY_BOOST more, where the system allows it;
    else it keeps the worker's."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, keeper, os.getpriority(os.PRIO_PROCESS, 0) - PRIORITY_BOOST)
