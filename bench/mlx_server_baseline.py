"""Baseline: mlx_lm.server (ships with mlx-lm) serving the demo model, driven through /v1/chat/completions.

Closed-loop clients at 1, 8 and 32 at once (non-streaming), then an overload probe: 64 clients at once
asking for 1000 tokens each with a 3 s client timeout, watching what the server does after they give up.
EOS is pushed down with logit_bias (mlx_lm.server has no ignore_eos), so every answer is max_tokens long;
the completion token counts actually returned are printed.
Run: .venv/bin/python -m bench.mlx_server_baseline [--size tiny|small] [--allow-eos]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from worker.blas import worker_env
from bench.common import bench_env, stop_process, summary

PROMPTS = [
    "Tell me a joke about queues.",
    "Write a short story about a patient robot.",
    "How long will I wait in line?",
    "Explain what a GPU does, in one paragraph.",
    "List five numbers and say why you like them.",
    "What can I help you with today?",
    "Describe the quick brown fox.",
    "Why does the worker never work for nobody?",
]
LEVELS = (1, 8, 32)
MAX_TOKENS = 64
MIN_REQUESTS = 128  # per level: enough samples at 1 client, at least 4 rounds per client at 32 (levels of ~1 s are noise here)
LEVEL_DEADLINE_S = 60.0
REQUEST_TIMEOUT_S = 60.0
OVERLOAD_CLIENTS = 64
OVERLOAD_TOKENS = 1000
OVERLOAD_TIMEOUT_S = 3.0
OVERLOAD_CAP_S = 120.0  # the whole probe, from the first request until the server is idle or we give up
CPU_SAMPLE_S = 0.25
QUIET_SAMPLES = 3  # this many samples in a row under IDLE_CORES count as idle
IDLE_CORES = 0.1
SETTLE_S = 60.0  # longest wait for leftovers of one phase (requests we timed out) before the next
START_TIMEOUT_S = 60.0


@dataclass
class Server:
    """A running mlx_lm.server child."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path


@dataclass
class Outcome:
    """One request: ok or the reason it failed, its latency, and the token counts it reported."""

    ok: bool
    latency: float
    error: str | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    status: int | None = None
    retry_after: str | None = None
    ended: float = 0.0  # time.monotonic() when the client got its answer or gave up


@dataclass
class Level:
    """Every outcome at one concurrency, and the wall time they took."""

    clients: int
    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.ok]


def free_port() -> int:
    """A loopback port nobody is listening on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def eos_id(model_path: str) -> int:
    """The model's EOS token id, from its config.json."""
    return int(json.loads((Path(model_path) / "config.json").read_text())["eos_token_id"])


def body(prompt: str, max_tokens: int, eos: int | None) -> dict[str, Any]:
    """A non-streaming chat request; with `eos`, a logit bias that keeps EOS from being chosen."""
    request: dict[str, Any] = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": False,
    }
    if eos is not None:
        request["logit_bias"] = {str(eos): -1e4}
    return request


def classify(exc: requests.RequestException) -> str:
    """A short name for why a request failed: timeout (connect/read), reset, refused or disconnected."""
    if isinstance(exc, requests.ConnectTimeout):
        return "connect timeout"
    if isinstance(exc, requests.Timeout):
        return "read timeout"
    text = repr(exc)
    for needle, name in (("Reset", "reset"), ("Refused", "refused"), ("RemoteDisconnected", "disconnected")):
        if needle in text:
            return name
    return type(exc).__name__


def post(url: str, request: dict[str, Any], timeout_s: float) -> Outcome:
    """POST one chat completion; never raises for network or HTTP errors."""
    started = time.monotonic()
    try:
        reply = requests.post(f"{url}/v1/chat/completions", json=request, timeout=timeout_s)
    except requests.RequestException as exc:
        return Outcome(False, time.monotonic() - started, classify(exc), ended=time.monotonic())
    ended = time.monotonic()
    retry_after = reply.headers.get("Retry-After")
    if reply.status_code != 200:
        return Outcome(False, ended - started, f"http {reply.status_code}", status=reply.status_code,
                       retry_after=retry_after, ended=ended)  # fmt: skip
    usage = reply.json().get("usage", {})
    return Outcome(
        True, ended - started, None,
        completion_tokens=int(usage.get("completion_tokens", 0)),
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        cached_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)),
        status=200, retry_after=retry_after, ended=ended,
    )  # fmt: skip


@contextmanager
def mlx_server(model_path: str, log_path: Path) -> Iterator[Server]:
    """Start `python -m mlx_lm server` on a free loopback port; wait until it answers; stop it on exit.

    It gets the BLAS onelane's workers get (OpenBLAS preloaded on Linux when present), so both run the same
    kernels."""
    port = free_port()
    cmd = [sys.executable, "-m", "mlx_lm", "server", "--model", model_path, "--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=worker_env(dict(os.environ)))
    server = Server(f"http://127.0.0.1:{port}", process, log_path)
    try:
        wait_ready(server, model_path)
        yield server
    finally:
        stop_process(process)


def wait_ready(server: Server, model_path: str) -> None:
    """Poll /health, then run two short completions so the model is loaded and warm."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"mlx_lm.server exited: {server.log_path.read_text()[-2000:]}")
        try:
            if requests.get(f"{server.url}/health", timeout=1).status_code == 200:
                break
        except requests.RequestException:
            pass
        time.sleep(0.1)
    else:
        raise TimeoutError(f"mlx_lm.server did not answer /health within {START_TIMEOUT_S:.0f} s")
    for prompt in PROMPTS[:2]:
        outcome = post(server.url, body(prompt, 8, eos_id(model_path)), START_TIMEOUT_S)
        if not outcome.ok:
            raise RuntimeError(f"warm-up request failed: {outcome.error}")


def client_loop(url: str, client: int, rounds: int, max_tokens: int, eos: int | None, deadline: float) -> list[Outcome]:
    """One closed-loop client: `rounds` requests back to back, none started after `deadline`."""
    outcomes = []
    for i in range(rounds):
        if time.monotonic() > deadline:
            break
        prompt = PROMPTS[(client * rounds + i) % len(PROMPTS)]
        outcomes.append(post(url, body(prompt, max_tokens, eos), REQUEST_TIMEOUT_S))
    return outcomes


def load_level(url: str, clients: int, max_tokens: int, eos: int | None) -> Level:
    """`clients` closed-loop clients at once, MIN_REQUESTS in all (at least 2 each), bounded in time."""
    rounds = max(2, math.ceil(MIN_REQUESTS / clients))
    deadline = time.monotonic() + LEVEL_DEADLINE_S
    level = Level(clients)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        futures = [pool.submit(client_loop, url, c, rounds, max_tokens, eos, deadline) for c in range(clients)]
        for future in futures:
            level.outcomes.extend(future.result())
    level.wall_s = time.monotonic() - started
    return level


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of `pid` from /proc (None where there is no /proc, as on macOS)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_rate(pid: int, seconds: float) -> float | None:
    """Cores' worth of CPU `pid` used over the next `seconds`."""
    before = cpu_seconds(pid)
    time.sleep(seconds)
    after = cpu_seconds(pid)
    return None if before is None or after is None else (after - before) / seconds


def wait_idle(pid: int, deadline: float) -> float | None:
    """Monotonic time the server's CPU fell under IDLE_CORES (for QUIET_SAMPLES samples); None if not by deadline."""
    quiet_since, quiet = 0.0, 0
    while time.monotonic() < deadline:
        sample_start = time.monotonic()
        rate = cpu_rate(pid, CPU_SAMPLE_S)
        if rate is None:
            return None
        quiet = quiet + 1 if rate <= IDLE_CORES else 0
        if quiet == 1:
            quiet_since = sample_start
        if quiet >= QUIET_SAMPLES:
            return quiet_since
    return None


def settle(server: Server) -> bool:
    """Wait (bounded) until the server has finished leftovers, e.g. requests whose clients timed out."""
    if cpu_seconds(server.process.pid) is None:
        return True  # no /proc: nothing to wait on
    return wait_idle(server.process.pid, time.monotonic() + SETTLE_S) is not None


def listen_overflows() -> int | None:
    """The kernel's count of connections dropped because a listen queue was full (system-wide; Linux only)."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            return dict(zip(names.split()[1:], map(int, values.split()[1:]))).get("ListenOverflows")
    return None


def log_count(server: Server, needles: Sequence[str], since: int) -> int:
    """Lines of the server's log after byte `since` containing any of `needles`."""
    with open(server.log_path, "rb") as log:
        log.seek(since)
        return sum(1 for line in log.read().decode(errors="replace").splitlines() if any(n in line for n in needles))


def overload_probe(server: Server, eos: int | None) -> dict[str, Any]:
    """64 clients at once, 1000 tokens each, 3 s timeout; then how long the server grinds on regardless."""
    pid = server.process.pid
    settled = settle(server)
    log_mark = server.log_path.stat().st_size
    cpu_before = cpu_seconds(pid)
    overflows_before = listen_overflows()
    barrier = threading.Barrier(OVERLOAD_CLIENTS, timeout=30)
    request = body(PROMPTS[0], OVERLOAD_TOKENS, eos)

    def one(_: int) -> Outcome:
        barrier.wait()
        return post(server.url, request, OVERLOAD_TIMEOUT_S)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=OVERLOAD_CLIENTS) as pool:
        outcomes = list(pool.map(one, range(OVERLOAD_CLIENTS)))
    gave_up = max(o.ended for o in outcomes)
    overflows_after = listen_overflows()
    deadline = started + OVERLOAD_CAP_S
    # A fresh 1-token request right after everyone gave up: what the next user waits.
    fresh: list[Outcome] = []
    prober = threading.Thread(
        target=lambda: fresh.append(post(server.url, body(PROMPTS[1], 1, None), max(1.0, deadline - time.monotonic())))
    )
    prober.start()
    idle_at = wait_idle(pid, deadline)
    prober.join(timeout=max(0.0, deadline - time.monotonic()) + 5)
    cpu_after = cpu_seconds(pid)
    time.sleep(0.2)  # let the server flush its log lines about the abandoned answers
    admitted = log_count(server, ['"POST /v1/chat/completions HTTP/1.1" 200'], log_mark)
    return {
        "outcomes": outcomes,
        "eos_suppressed": eos is not None,
        "gave_up_after_s": gave_up - started,
        "busy_after_give_up_s": None if idle_at is None else max(0.0, idle_at - gave_up),
        "still_busy_at_cap": idle_at is None and cpu_before is not None,
        "cap_s": OVERLOAD_CAP_S,
        "cpu_s": None if cpu_before is None or cpu_after is None else cpu_after - cpu_before,
        "settled_before": settled,
        "fresh_request": fresh[0] if fresh else None,
        # the server logs status 200 when a request enters generation; the fresh request is one of them
        "admitted": admitted - (1 if fresh and fresh[0].status == 200 else 0),
        "listen_overflows": None if overflows_before is None or overflows_after is None
        else overflows_after - overflows_before,
        "write_errors": log_count(server, ["BrokenPipeError", "ConnectionResetError"], log_mark),
    }


def run(
    model_path: str, levels: Sequence[int] = LEVELS, max_tokens: int = MAX_TOKENS, allow_eos: bool = False,
    overload: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Start mlx_lm.server on `model_path`, load it at each concurrency in `levels`, then probe overload.

    Returns {"levels": [Level], "unsettled": [clients whose leftovers outlived SETTLE_S], "overload": dict | None}.
    """
    eos = None if allow_eos else eos_id(model_path)
    done: list[Level] = []
    unsettled: list[int] = []
    with tempfile.TemporaryDirectory(prefix="onelane-mlx-server-") as tmp:
        with mlx_server(model_path, Path(tmp) / "server.log") as server:
            for clients in levels:
                done.append(load_level(server.url, clients, max_tokens, eos))
                if not settle(server):
                    unsettled.append(clients)
            probe = overload_probe(server, eos) if overload else None
    return {"levels": done, "unsettled": unsettled, "overload": probe}


def level_lines(level: Level) -> list[str]:
    """The printed lines for one concurrency level."""
    ok, failed = level.ok, [o for o in level.outcomes if not o.ok]
    errors = ", ".join(f"{name} {n}" for name, n in Counter(o.error for o in failed).most_common()) or "none"
    tokens = [o.completion_tokens for o in ok]
    head = f"mlx_lm.server c={level.clients}:"
    lines = [f"{head} sent {len(level.outcomes)}, ok {len(ok)}, failed {len(failed)} ({errors})"]
    if ok:
        prompt, cached = sum(o.prompt_tokens for o in ok), sum(o.cached_tokens for o in ok)
        lines += [
            f"{head} latency {summary([o.latency for o in ok])}",
            f"{head} {len(ok) / level.wall_s:.2f} req/s, {sum(tokens) / level.wall_s:.1f} completion tok/s "
            f"over {level.wall_s:.2f} s",
            f"{head} completion tokens/request min {min(tokens)}, median {statistics.median(tokens):.0f}, "
            f"max {max(tokens)}; prompt tokens served from its prompt cache {cached} of {prompt}",
        ]
    return lines


def overload_lines(probe: dict[str, Any]) -> list[str]:
    """The printed lines for the overload probe."""
    outcomes: list[Outcome] = probe["outcomes"]
    ok = [o for o in outcomes if o.ok]
    failed = Counter(o.error for o in outcomes if not o.ok)
    statuses = sorted({o.status for o in outcomes if o.status in (429, 503)})
    retry_after = sorted({o.retry_after for o in outcomes if o.retry_after})
    head = f"overload ({OVERLOAD_CLIENTS} clients x {OVERLOAD_TOKENS} tokens, {OVERLOAD_TIMEOUT_S:.0f} s timeout):"
    lines = [] if probe["settled_before"] else [f"{head} WARNING: server still busy with earlier requests at start"]
    lines += [
        f"{head} answered {len(ok)}, failed {sum(failed.values())} ("
        + (", ".join(f"{name} {n}" for name, n in failed.most_common()) or "none") + ")",
        f"{head} 429/503 seen: {statuses or 'none'}; Retry-After seen: {retry_after or 'none'}",
        f"{head} last client gave up {probe['gave_up_after_s']:.2f} s after the burst; "
        f"server admitted {probe['admitted']} of them into generation",
    ]  # fmt: skip
    if probe["listen_overflows"] is not None:
        lines.append(f"{head} kernel listen-queue overflows during the burst: {probe['listen_overflows']} "
                     "(TcpExt ListenOverflows, system-wide; the server listens with a backlog of 5)")  # fmt: skip
    busy = probe["busy_after_give_up_s"]
    cpu = f"{probe['cpu_s']:.1f} s CPU" if probe["cpu_s"] is not None else "CPU time unavailable"
    if busy is not None:
        lines.append(f"{head} server kept generating {busy:.2f} s after the last client gave up ({cpu} in all)")
    elif probe["still_busy_at_cap"]:
        lines.append(f"{head} server still generating when the {probe['cap_s']:.0f} s cap ended the probe ({cpu})")
    else:
        lines.append(f"{head} server idle time unknown (no /proc)")
    lines.append(
        f"{head} {probe['write_errors']} answers were finished for clients already gone (broken pipe/reset in its "
        f"log): {'' if probe['eos_suppressed'] else 'up to '}{probe['write_errors'] * OVERLOAD_TOKENS} "
        "tokens generated for nobody"
    )
    fresh: Outcome | None = probe["fresh_request"]
    if fresh is not None:
        state = "answered" if fresh.ok else f"failed ({fresh.error})"
        lines.append(f"{head} a 1-token request sent right after they gave up {state} in {fresh.latency:.2f} s")
    return lines


def main() -> None:
    """Run every level and the overload probe against a fresh demo model and print the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrent clients, comma-separated")
    parser.add_argument("--allow-eos", action="store_true", help="no logit bias against EOS: answers may end early")
    parser.add_argument("--no-overload", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with bench_env(args.size) as settings:
        counts = [int(c) for c in args.levels.split(",")]
        results = run(settings.model_path, counts, args.max_tokens, args.allow_eos, not args.no_overload)
    eos_note = "EOS allowed" if args.allow_eos else "EOS suppressed by logit_bias"
    print(f"mlx_lm.server, demo model {args.size}, max_tokens {args.max_tokens}, temperature 0, {eos_note}, "
          f"non-streaming; load average {load:.2f} before, {os.getloadavg()[0]:.2f} after")  # fmt: skip
    levels: list[Level] = results["levels"]
    unsettled: list[int] = results["unsettled"]
    for level in levels:
        print("\n".join(level_lines(level)))
        if level.clients in unsettled:
            print(f"mlx_lm.server c={level.clients}: WARNING: still generating {SETTLE_S:.0f} s after the level ended")
    if results["overload"] is not None:
        print("\n".join(overload_lines(results["overload"])))


if __name__ == "__main__":
    main()
