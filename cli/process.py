"""Who a process is, as this user can see it: its owner, when it started and its command line. The terminal client
trusts the web that an `onelane up` recorded only while the pid it names is still that up (cli/url.py).

Linux reads /proc; elsewhere (macOS) `ps` tells. A start time is compared only with one read the same way: a pid
that the system gave to a later process has another.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


class Unknown(Exception):
    """This system does not say who runs a pid (no /proc, no ps)."""


@dataclass(frozen=True)
class Process:
    uid: int  # its real user
    started: str  # opaque: equal only for the same process
    argv: tuple[str, ...]


def describe(pid: int) -> Process | None:
    """The process running as `pid`, None when there is none; Unknown when this system cannot tell."""
    if Path("/proc/self/stat").exists():
        return _from_proc(pid)
    return _from_ps(pid)


def _from_proc(pid: int) -> Process | None:
    folder = Path(f"/proc/{pid}")
    try:
        stat, status = (folder / "stat").read_text(), (folder / "status").read_text()
        cmdline = (folder / "cmdline").read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:  # hidden from us (hidepid)
        raise Unknown(f"/proc/{pid}: {exc.strerror}") from None
    # stat's second field, the command's name in parentheses, may hold spaces: its 22nd, starttime, is counted after it
    started = stat[stat.rindex(")") + 1 :].split()[19]
    uid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:"))
    argv = tuple(arg.decode(errors="replace") for arg in cmdline.rstrip(b"\0").split(b"\0") if cmdline)
    return Process(uid, started, argv)


def _from_ps(pid: int) -> Process | None:
    try:
        ps = subprocess.run(
            ["ps", "-o", "uid=,lstart=,command=", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=10,
            env={**os.environ, "LC_ALL": "C"},  # lstart's words in one language, whoever reads them
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unknown(f"ps: {exc}") from None
    fields = ps.stdout.split(None, 6)  # uid, lstart's five words ("Mon Jan  1 12:00:00 2024"), the command
    if ps.returncode != 0 and not fields:
        return None
    if len(fields) < 7 or not fields[0].isdigit():
        raise Unknown(f"ps said {ps.stdout.strip()!r} {ps.stderr.strip()!r}")
    return Process(int(fields[0]), " ".join(fields[1:6]), tuple(fields[6].split()))
