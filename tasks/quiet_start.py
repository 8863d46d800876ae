"""A stop signal that comes while a service process (a worker, the web) starts.

The terminal's Ctrl-C reaches every process of its group at once, and a worker process spends seconds on its imports
(MLX, mlx-lm, transformers) before it sets its own handlers (worker/main.py `run`), the web a second on Flask's and
gevent's before gunicorn sets its. Python's default would raise KeyboardInterrupt in the middle of an import and print
its traceback. A process that has not set its own handlers holds nothing (no lease, no job, no model, no socket), so
it just exits, at once and quietly, as a stopped one does: with 0. (`onelane up` holds its Redis from its first
steps: it keeps its own handlers instead.) Import nothing here that is slow to import.

Before any of its code runs, though, a new interpreter is Python's alone: a Ctrl-C there killed it by the signal, or
raised KeyboardInterrupt inside Python's own start ("Fatal Python error: init_import_site" and a traceback, seen
beside a busy machine's `onelane up`). So a parent starts a service with `start_service`: the child begins with
SIGINT blocked, which holds a Ctrl-C back without losing it, and `exit_quietly_on_stop` unblocks it once its quiet
handler is set, which then ends the process as above.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

HELD = {signal.SIGINT}


def start_service(command: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen(command, **popen)`, for a child that calls `exit_quietly_on_stop` first: a Ctrl-C that lands
    in its interpreter's start waits for that call. (A child inherits the signal mask of the thread that starts it;
    this thread blocks SIGINT only meanwhile, and the process's other threads still take the parent's own Ctrl-C.)"""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    try:
        return subprocess.Popen(command, **popen)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def exit_quietly_on_stop() -> None:
    """Until `run` replaces them: SIGINT and SIGTERM end the process at once, with no traceback (a Ctrl-C that
    `start_service` held back too)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def _exit(signum: int, frame: object) -> None:
    os._exit(0)
