"""SIGINT and SIGTERM as a stop: an event set from a thread of its own, never from the signal's handler.

Python runs a signal's handler in the main thread, between two of its bytecodes, wherever that thread is. A handler
that set a `threading.Event` itself took the event's lock there: when the main thread already held it (inside its
own `wait` on that event, or inside the handler of a first signal when a second came: the terminal's Ctrl-C and a
supervisor's SIGTERM arrive together), the thread blocked on a lock it held, for good, and the process never
stopped (a worker killed by its supervisor 30 s later; unsupervised, alive for nobody with every thread on a
futex). Here the handler does nothing in Python: the interpreter's own C handler writes the signal's number to a
pipe (`signal.set_wakeup_fd`), and a thread that reads it sets the event.
"""

from __future__ import annotations

import os
import signal
import threading

STOPS = (signal.SIGINT, signal.SIGTERM)


def stop_on_signals(stopping: threading.Event) -> None:
    """From now on SIGINT and SIGTERM set `stopping` (call it from the main thread, once a process)."""
    read, write = os.pipe()
    os.set_blocking(write, False)  # (the interpreter's C handler must never block on it)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    for sig in STOPS:
        signal.signal(sig, _noted)

    def watch() -> None:
        while not any(number in STOPS for number in os.read(read, 64)):
            pass  # (another signal Python handles: not a stop)
        stopping.set()

    threading.Thread(target=watch, name="stop-signals", daemon=True).start()


def _noted(signum: int, frame: object) -> None:
    """The Python handler: nothing (the wakeup pipe has the signal already), and no lock taken."""
