"""A stop signal stops a process wherever its main thread is (tasks/stop_signals.py): even holding the lock of the very
event the stop sets, as it does inside its own wait on that event, or inside a first signal's handler when a second
comes (a terminal's Ctrl-C and a supervisor's SIGTERM together). A handler that set the event itself blocked there for
good: an `onelane up` stopped 1 time in 4 after a few jobs waited 30 s for its supervisor to kill its worker."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# a process whose main thread holds the stop event's lock when SIGINT and then SIGTERM reach it
HELD = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from {module} import stop_on_signals

    stopping = threading.Event()
    stop_on_signals(stopping)
    with stopping._cond:  # (what Event.wait holds between its checks)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # the handlers run here, between these bytecodes, the lock held
            time.sleep(0)
    sys.exit(0 if stopping.wait(60) else 3)
    """
)


def test_a_stop_signal_while_the_main_thread_holds_the_events_lock_stops_the_process() -> None:
    # Given a process whose main thread holds its stop event's lock when two stop signals come
    process = subprocess.run(
        [sys.executable, "-c", HELD.format(module="tasks.stop_signals")], capture_output=True, timeout=120
    )
    # Then its stop event is set once the lock is let go, and the process ends as it should (not blocked on its lock)
    assert process.returncode == 0, process.stderr.decode()[-2000:]
