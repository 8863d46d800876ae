"""mlx_lm.server (it ships with mlx-lm) as the baseline: started on the demo model, driven through
/v1/chat/completions, probed with an overload burst, and printed. EOS is pushed down with logit_bias (it has no
ignore_eos), so every answer is max_tokens long. Its BLAS is chosen (`blas`: stock OpenBLAS, or with onelane's shim
ahead of it, as onelane's worker has) and read back from the running process (`loaded_blas`)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import openai_load as load
from bench.harness import START_S, answers, free_port, poll_until, spawn
from bench.proc import proc_cpu, wait_idle
from bench.report import summary
from worker.blas import SHIM_PREFIX, worker_env


@dataclass
class Server:
    """A running mlx_lm.server child."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    eos: int | None  # the EOS token its requests push down, if any
    blas: str = ""  # what it asked for: "stock" or "shim" (see mlx_server); what it got is loaded_blas(pid)


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


BLAS_CHOICES = ("stock", "shim")


@contextmanager
def mlx_server(
    model_path: str, log_path: Path, allow_eos: bool = False, blas: str = "stock", var_dir: Path | None = None
) -> Iterator[Server]:
    """`python -m mlx_lm server` on a free loopback port, answering and warm (two short completions) when yielded.

    It gets OpenBLAS preloaded on Linux when present, as onelane's workers do (MLX's bundled BLAS is several times
    slower: a user who serves on a Linux CPU would preload it too; worker/blas/ worker_env, so ONELANE_OPENBLAS
    in this environment applies to it too). `blas`: "stock" (the default) preloads OpenBLAS alone; "shim" puts
    onelane's shim (worker/blas/shim.c, built into `var_dir`/lib, the log's folder unless given: the same file as a
    worker's whose ONELANE_VAR_DIR that is) ahead of it, exactly the preload onelane's worker gets, so that a
    comparison measures the servers and not the shim. The shim then runs at its built-in default, every product
    through its own kernel, which is what the worker does with ONELANE_GEMV on (the default);
    mlx_lm.server cannot be told ONELANE_GEMV=false.
    """
    if blas not in BLAS_CHOICES:
        raise ValueError(f"blas must be one of {BLAS_CHOICES}, not {blas!r}")
    port = free_port()
    cmd = [sys.executable, "-m", "mlx_lm", "server", "--model", model_path, "--host", "127.0.0.1", "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # (this process may have the shim preloaded)
    env["ONELANE_VAR_DIR"] = str(var_dir or log_path.parent)  # (where worker_env builds the shim; mlx-lm ignores it)
    with spawn(cmd, log_path, worker_env(env, shim=blas == "shim")) as process:
        server = Server(f"http://127.0.0.1:{port}", process, log_path, None if allow_eos else eos_id(model_path), blas)

        def up() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"mlx_lm.server exited: {log_path.read_text()[-2000:]}")
            return answers(port, "/health")

        if not poll_until(up, START_S):
            raise TimeoutError(f"mlx_lm.server did not answer /health within {START_S:.0f} s")
        for prompt in load.PROMPTS[:2]:
            outcome = load.post_chat(server.url, body(prompt, 8, eos_id(model_path)), START_S)
            if not outcome.ok:
                raise RuntimeError(f"warm-up request failed: {outcome.error}")
        yield server


def loaded_blas(pids: Sequence[int]) -> str:
    """Which BLAS the processes `pids` run on, read from /proc (their memory maps, and their LD_PRELOAD): "OpenBLAS
    + onelane's shim", "OpenBLAS, no shim" or "MLX's own BLAS (no OpenBLAS loaded)", of the first that maps OpenBLAS
    (e.g. a supervisor's worker), else of the first; "unknown (no /proc)" where that cannot be read."""
    seen = []
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text(errors="replace")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        openblas = next((line.split()[-1] for line in maps.splitlines() if "libopenblas" in line), None)
        shim = any(SHIM_PREFIX in line for line in maps.splitlines())
        preload = next((e.decode(errors="replace")[11:] for e in environ if e.startswith(b"LD_PRELOAD=")), "")
        preloaded = " ".join(Path(p).name for p in preload.split()) or "nothing"
        if openblas is None:
            seen.append(f"MLX's own BLAS (no OpenBLAS loaded; LD_PRELOAD {preloaded})")
        else:
            kind = "OpenBLAS + onelane's shim" if shim else "OpenBLAS, no shim"
            seen.append(f"{kind} ({Path(openblas).parent.name}/{Path(openblas).name}; LD_PRELOAD {preloaded})")
            return seen[-1]
    return seen[0] if seen else "unknown (no /proc)"


def load_level(server: Server, clients: int, max_tokens: int, requests: int = load.MIN_REQUESTS) -> load.Level:
    """`clients` closed-loop clients at once (see openai_load.closed_loop)."""
    return load.closed_loop(
        clients,
        lambda prompt: load.post_chat(server.url, body(prompt, max_tokens, server.eos), load.REQUEST_TIMEOUT_S),
        requests,
    )


def settle(server: Server) -> bool:
    """Wait (bounded) until the server has finished leftovers, e.g. requests whose clients timed out."""
    if proc_cpu(server.process.pid) is None:
        return True  # no /proc: nothing to wait on
    return wait_idle(server.process.pid, time.monotonic() + load.SETTLE_S) is not None


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


def overload_probe(server: Server) -> dict[str, Any]:
    """64 clients at once, 1000 tokens each, 3 s timeout; then how long the server grinds on regardless."""
    pid = server.process.pid
    settled = settle(server)
    log_mark = server.log_path.stat().st_size
    cpu_before = proc_cpu(pid)
    overflows_before = listen_overflows()
    request = body(load.PROMPTS[0], load.OVERLOAD_TOKENS, server.eos)
    outcomes, started, gave_up = load.burst(lambda _: load.post_chat(server.url, request, load.OVERLOAD_TIMEOUT_S))
    overflows_after = listen_overflows()
    idle_at, fresh = load.aftermath(
        pid,
        started + load.OVERLOAD_CAP_S,
        lambda timeout_s: load.post_chat(server.url, body(load.PROMPTS[1], 1, None), timeout_s),
    )
    cpu_after = proc_cpu(pid)
    time.sleep(0.2)  # let the server flush its log lines about the abandoned answers
    admitted = log_count(server, ['"POST /v1/chat/completions HTTP/1.1" 200'], log_mark)
    return {
        "outcomes": outcomes,
        "eos_suppressed": server.eos is not None,
        "gave_up_after_s": gave_up - started,
        "busy_after_give_up_s": None if idle_at is None else max(0.0, idle_at - gave_up),
        "still_busy_at_cap": idle_at is None and cpu_before is not None,
        "cap_s": load.OVERLOAD_CAP_S,
        "cpu_s": None if cpu_before is None or cpu_after is None else cpu_after - cpu_before,
        "settled_before": settled,
        "fresh_request": fresh,
        # the server logs status 200 when a request enters generation; the fresh request is one of them
        "admitted": admitted - (1 if fresh and fresh.status == 200 else 0),
        "listen_overflows": None
        if overflows_before is None or overflows_after is None
        else overflows_after - overflows_before,
        "write_errors": log_count(server, ["BrokenPipeError", "ConnectionResetError"], log_mark),
    }


def mlx_level_lines(level: load.Level) -> list[str]:
    """The printed lines for one concurrency level."""

    def details(ok: list[load.Outcome]) -> tuple[str, str]:
        tokens = [o.completion_tokens for o in ok]
        prompt, cached = sum(o.prompt_tokens for o in ok), sum(o.cached_tokens for o in ok)
        return (
            f"latency {summary([o.latency for o in ok])}",
            f"completion tokens/request min {min(tokens)}, median {statistics.median(tokens):.0f}, max "
            f"{max(tokens)}; prompt tokens served from its prompt cache {cached} of {prompt}",
        )

    return load.level_lines("mlx_lm.server", level, details)


def overload_lines(probe: dict[str, Any]) -> list[str]:
    """The printed lines for the overload probe."""
    outcomes: list[load.Outcome] = probe["outcomes"]
    ok = [o for o in outcomes if o.ok]
    failed = Counter(o.error for o in outcomes if not o.ok)
    statuses = sorted({o.status for o in outcomes if o.status in (429, 503)})
    retry_after = sorted({o.retry_after for o in outcomes if o.retry_after})
    head = load.OVERLOAD_HEAD
    lines = [] if probe["settled_before"] else [f"{head} WARNING: server still busy with earlier requests at start"]
    lines += [
        f"{head} answered {len(ok)}, failed {sum(failed.values())} ("
        + (", ".join(f"{name} {n}" for name, n in failed.most_common()) or "none")
        + ")",
        f"{head} 429/503 seen: {statuses or 'none'}; Retry-After seen: {retry_after or 'none'}",
        f"{head} last client gave up {probe['gave_up_after_s']:.2f} s after the burst; "
        f"server admitted {probe['admitted']} of them into generation",
    ]
    if probe["listen_overflows"] is not None:
        lines.append(
            f"{head} kernel listen-queue overflows during the burst: {probe['listen_overflows']} "
            "(TcpExt ListenOverflows, system-wide; the server listens with a backlog of 5)"
        )
    busy = probe["busy_after_give_up_s"]
    cpu = f"{probe['cpu_s']:.1f} s CPU" if probe["cpu_s"] is not None else "CPU time unavailable"
    if busy is not None:
        lines.append(f"{head} server kept generating {busy:.2f} s after the last client gave up ({cpu} in all)")
    elif probe["still_busy_at_cap"]:
        lines.append(f"{head} server still generating when the {probe['cap_s']:.0f} s cap ended the probe ({cpu})")
    else:
        lines.append(f"{head} server idle time unknown (no /proc)")
    lines.append(
        f"{head} {probe['write_errors']} answers were finished for clients already gone (broken pipe/reset "
        f"in its log): {'' if probe['eos_suppressed'] else 'up to '}{probe['write_errors'] * load.OVERLOAD_TOKENS} "
        "tokens generated for nobody"
    )
    fresh: load.Outcome | None = probe["fresh_request"]
    if fresh is not None:
        state = "answered" if fresh.ok else f"failed ({fresh.error})"
        lines.append(f"{head} a 1-token request sent right after they gave up {state} in {fresh.latency:.2f} s")
    return lines
