"""What /proc says about the processes a benchmark started (Linux; None or 0 where there is no /proc, as on macOS):
their children and groups, CPU seconds by process and by thread, memory and descriptors, and Redis's own CPU.

Its imports are the standard library only, as harness.py's are.
"""

from __future__ import annotations

import os
import time
from contextlib import suppress
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _live(field: int, value: int) -> list[int]:
    """Live processes whose /proc stat field `field` (after the name: 1 = parent, 2 = group) is `value`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields and int(fields[field]) == value and fields[0] not in ("Z", "X"):
                found.append(int(entry))
    return sorted(found)


def children(pid: int) -> list[int]:
    """Live child processes of `pid`."""
    return _live(1, pid)


def group_members(pgid: int) -> list[int]:
    return _live(2, pgid)


def pid_dead(pid: int) -> bool:
    """True once `pid` is gone or a zombie (it can no longer run code)."""
    fields = _stat(pid)
    return fields is None or fields[0] in ("Z", "X")


def proc_cpu(pid: int) -> float | None:
    """User + system CPU seconds `pid` used so far (None if it is gone, or there is no /proc, as on macOS)."""
    fields = _stat(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Each live thread of `pid`: its id -> (its name in the OS, /proc's comm; user + system CPU seconds so far)."""
    found = {}
    with suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with suppress(OSError, IndexError):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    name, rest = f.read().split(" (", 1)[1].rsplit(")", 1)
                fields = rest.split()
                found[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / CLK_TCK)
    return found


def descendants(pid: int) -> list[int]:
    """`pid` and its live descendants, children first found first."""
    found, i = [pid], 0
    while i < len(found):
        found += children(found[i])
        i += 1
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by `pids` (each process itself, not its children)."""
    return sum(proc_cpu(pid) or 0.0 for pid in pids)


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all cores, from /proc/stat)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / CLK_TCK


def rss_kb(pid: int) -> int:
    """VmRSS of `pid` in kB (0 if gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def open_fds(pid: int) -> int:
    """How many file descriptors `pid` has open (-1 if unknown)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def redis_cpu(client: Any) -> float:
    """CPU seconds Redis has used so far (its own INFO)."""
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def cpu_now(pids: list[int], client: Any) -> tuple[float, float, float]:
    """CPU seconds used so far by `pids`, by the Redis of `client`, and by the whole machine: subtract two."""
    return cpu_seconds(pids), redis_cpu(client), machine_busy()


def wait_idle(
    pid: int, deadline: float, sample_s: float = 0.25, quiet_samples: int = 3, cores: float = 0.1
) -> float | None:
    """When `pid`'s CPU fell under `cores` for `quiet_samples` samples in a row (monotonic); None if not by `deadline`."""
    quiet_since, quiet = 0.0, 0
    while time.monotonic() < deadline:
        sample_start = time.monotonic()
        before = proc_cpu(pid)
        time.sleep(sample_s)
        after = proc_cpu(pid)
        if before is None or after is None:
            return None
        quiet = quiet + 1 if (after - before) / sample_s <= cores else 0
        if quiet == 1:
            quiet_since = sample_start
        if quiet >= quiet_samples:
            return quiet_since
    return None
