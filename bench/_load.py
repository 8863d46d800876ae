"""Helpers shared by bench/admission.py and bench/streams.py: run `onelane web` as a child, find its gunicorn
workers, read their memory and CPU (and the whole machine's) from /proc, and read Redis's own CPU.

Standard library only (HTTP via http.client), so a script may gevent-patch before importing it.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tasks.settings import Settings

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def web_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of `onelane web`, pointed at the bench's Redis and model."""
    return {
        **os.environ,
        "REDIS_URL": settings.effective_redis_url,
        "ONELANE_MODEL": settings.model_path,
        "ONELANE_VAR_DIR": str(settings.var_dir),
        "ONELANE_LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


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


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by `pids` (each process itself, not its children)."""
    total = 0
    for pid in pids:
        fields = _stat(pid)
        if fields:
            total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


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


def redis_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def http_request(port: int, method: str, path: str, body: bytes | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@contextmanager
def onelane_web(settings: Settings, port: int, workers: int, log_path: Path, **env_extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """`onelane web --port P --workers N` in a process group of its own, up (GET /healthz answers 200) when
    yielded, and stopped on exit: SIGTERM, then SIGKILL for anything of its group still alive."""
    args = [sys.executable, "-m", "tasks.cli", "web", "--port", str(port), "--workers", str(workers)]
    with open(log_path, "ab") as log:
        child = subprocess.Popen(args, env=web_env(settings, **env_extra), stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while True:
                if child.poll() is not None:
                    raise RuntimeError(f"onelane web exited ({child.returncode}):\n{tail(log_path)}")
                try:
                    if http_request(port, "GET", "/healthz", timeout=2)[0] == 200 and len(children(child.pid)) >= workers:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"onelane web did not answer within 60 s:\n{tail(log_path)}")
                time.sleep(0.1)
            yield child
        finally:
            stop_group(child, "onelane web")


def stop_group(child: subprocess.Popen[bytes], name: str, timeout_s: float = 20.0) -> None:
    """SIGTERM `child`, then SIGKILL whatever of its process group is still alive (one pid at a time)."""
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"  ! {name} (pid {child.pid}) ignored SIGTERM for {timeout_s:.0f} s")
    for _ in range(3):
        left = group_members(child.pid)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    if child.poll() is None:
        child.wait(timeout=10)


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
