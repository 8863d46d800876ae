"""A stop signal that comes while a service process (a worker, the web) starts.

The terminal's Ctrl-C reaches every process of its group at once, and a worker process spends seconds on its imports
(MLX, mlx-lm, transformers) before it sets its own handlers (worker/main.py `run`), the web a second on Flask's and
gevent's before gunicorn sets its. Python's default would raise KeyboardInterrupt in the middle of an import and print
its traceback. A process that has not set its own handlers holds nothing (no lease, no job, no model, no socket), so
it just exits, at once and quietly, as a stopped one does: with 0. (`onelane up` holds its Redis from its first
steps: it keeps its own handlers instead.) Import nothing here that is slow to import.
"""

from __future__ import annotations

import os
import signal


def exit_quietly_on_stop() -> None:
    """Until `run` replaces them: SIGINT and SIGTERM end the process at once, with no traceback."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit)


def _exit(signum: int, frame: object) -> None:
    os._exit(0)
