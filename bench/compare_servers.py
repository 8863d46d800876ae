"""onelane vs mlx_lm.server: same machine, same run, same model folder, same prompts, same request counts.

    ./dev.sh bench compare_servers [--model smollm2|demo|random|PATH] [--workload stream|ignore-eos]
                                   [--levels 1,8,32] [--rounds 3] [--plain 5 --streamed 2] [--max-tokens N]
                                   [--no-engine] [--no-prefix-cache] [--no-overload] [--peer-blas shim|stock|both]

A full default run (the default model, the streaming workload at 1, 8 and 32 clients, 3 rounds, the bare engine's
figure, the overload probe):

    .venv/bin/python -m bench.compare_servers --model smollm2 --workload stream --levels 1,8,32 --rounds 3

`--model smollm2` (the default) is SmolLM2-135M-Instruct imported from its GGUF as float32 into the run's folder,
the folder both servers load; `demo` is worker/demo; `random` a random model of `--size`.

`--peer-blas` is the BLAS mlx_lm.server runs on (bench/mlx_server.py). `shim` (the default): the preload onelane's
worker gets, Debian's OpenBLAS with onelane's shim (worker/blas/shim.c) ahead of it, so that the ratio is the queue's
and its scheduler's, not the shim's; the peer is listed as `mlx_lm.server+shim`. `stock`: OpenBLAS alone, listed as
`mlx_lm.server` (the comparison before this option). `both`: the two peers up side by side, each measured in every
round, and the ratios printed against each (and the shim's own effect on the peer, one peer over the other). The
report names the BLAS each side ran on, read from the running processes (their memory maps and LD_PRELOAD).

1. Inside one bench_env, the servers up side by side (each idle while another is measured): `onelane worker`
   (supervised) and `onelane web` as subprocesses, queue bounds of 1000 so nothing is rejected; and mlx_lm.server
   (two of them with `--peer-blas both`).
   For each of `--rounds` rounds and each level, closed-loop clients through POST /v1/chat/completions against one
   server, then the other, the order rotating, so a disturbance of this shared machine falls on both alike:
   - `--workload stream` (the default; issue 33's, what a chat UI sees): each client sends `--plain` plain and
     `--streamed` streamed requests of its own prompts back to back (temperature 0, natural stops, max_tokens 32,
     each on a fresh connection); per level: completion tokens/s over the wall, the streamed requests' time to the
     first content chunk (p50/p90/p99), failures by kind (connection resets counted, not retried). With the bare
     engine in the rotation (unless `--no-engine`): worker/batch/engine.py's Engine in this process, on OpenBLAS as the
     worker, the same clients' prompts with every client's sequence in its batch (ONELANE_MAX_BATCH and
     ONELANE_PREFILL_STEP as onelane's worker gets them): queue efficiency = onelane's tokens/s over its.
   - `--workload ignore-eos` (the earlier one): `--requests` non-streaming requests per level, every answer forced
     to max_tokens (onelane `"ignore_eos": true`, mlx_lm.server a logit bias against EOS; the usage is checked);
     then time to first token through each one's stream at 1 client, alternating request by request.
2. The onelane web restarted with ONELANE_MAX_QUEUE=16 (and 16 per user) for the overload probe: 64 clients at
   once, 1000 tokens each, 3 s client timeout; the jobs are read back from Redis to see what the worker did for
   clients that had gone, and a 1-token request is sent right after they gave up.
3. onelane stopped (worker included), then the same probe against mlx_lm.server (with two, each alone: the first
   is stopped once probed).
4. Each round's figures, then per level the median over the rounds with min-max, and the ratios onelane/peer.

Loopback only; every loop is bounded in count and time; every process started here is stopped before the
script returns. Every figure printed is measured in this run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

from bench.harness import (
    START_S,
    bench_env,
    free_port,
    matching_lines,
    onelane_web,
    onelane_worker,
    queue_bounds,
    rotated,
)
from bench.mlx_server import (
    BLAS_CHOICES,
    body,
    listen_overflows,
    load_level,
    loaded_blas,
    mlx_level_lines,
    mlx_server,
    overload_lines,
    overload_probe,
    settle,
)
from bench.onelane_overload import (
    Abandoned,
    OverloadRow,
    abandoned,
    onelane_body,
    onelane_overload,
    onelane_overload_lines,
    overload_row,
    settle_queue,
)
from bench.openai_load import (
    LEVELS,
    MAX_TOKENS,
    MIN_REQUESTS,
    OVERLOAD_CLIENTS,
    OVERLOAD_TOKENS,
    PROMPTS,
    REQUEST_TIMEOUT_S,
    SETTLE_S,
    Level,
    Outcome,
    Streamed,
    closed_loop,
    level_lines,
    post_chat,
    stream_once,
)
from bench.proc import group_members
from bench.report import ms, pct, span
from bench.streaming_load import MAX_TOKENS as STREAM_MAX_TOKENS
from bench.streaming_load import (
    MIN_LEVEL_REQUESTS,
    PLAIN,
    STREAMED,
    MixLevel,
    Row,
    client_plan,
    engine_level,
    http_level,
    http_sender,
    markdown,
    prompts,
    streamed_at,
    summary_lines,
)
from bench.streaming_load import level_lines as mix_level_lines
from tasks.settings import Settings
from tasks.store import Store
from worker.blas import preload_openblas

BIG_QUEUE = 1000  # the main levels: a bound no level reaches
OVERLOAD_QUEUE = 16  # the overload probe: onelane sheds the rest
TTFT_REQUESTS = 16  # sequential streams at 1 client, per server
LOG_NEEDLES = ("Traceback", " ERROR ", " CRITICAL ")
PEER_NAMES = {"stock": "mlx_lm.server", "shim": "mlx_lm.server+shim"}  # by --peer-blas
PEER = "mlx_lm.server"  # how streaming_load's and mlx_server's printed lines name the peer (see renamed)


# --- onelane -------------------------------------------------------------------------------------------------


def onelane_level(url: str, model: str, clients: int, max_tokens: int, requests: int) -> Level:
    """The baseline's level, against onelane (see closed_loop)."""
    return closed_loop(
        clients, lambda prompt: post_chat(url, onelane_body(model, prompt, max_tokens), REQUEST_TIMEOUT_S), requests
    )


# --- printing ------------------------------------------------------------------------------------------------


def level_stats(level: Level) -> dict[str, float | None]:
    ok = level.ok
    lat = [o.latency for o in ok]
    return {
        "p50": pct(lat, 50) if lat else None,
        "p99": pct(lat, 99) if lat else None,
        "rps": len(ok) / level.wall_s if level.wall_s else None,
        "tps": sum(o.completion_tokens for o in ok) / level.wall_s if level.wall_s else None,
    }


def onelane_level_lines(level: Level, max_tokens: int) -> list[str]:
    def details(ok: list[Outcome]) -> tuple[str, str]:
        s = level_stats(level)
        tokens = [o.completion_tokens for o in ok]
        wrong = sum(1 for t in tokens if t != max_tokens)
        queue = [o.queue_s for o in ok if o.queue_s is not None]
        return (
            f"latency p50 {ms(s['p50'])} ms, p99 {ms(s['p99'])} ms, mean "
            f"{statistics.fmean(o.latency for o in ok) * 1000:.0f} ms; of which queue wait (x-queue-time) p50 "
            f"{ms(pct(queue, 50) if queue else None)} ms, p99 {ms(pct(queue, 99) if queue else None)} ms",
            f"usage.completion_tokens min {min(tokens)}, max {max(tokens)} ({wrong} answers != {max_tokens}); "
            f"finish_reason {dict(Counter(o.finish_reason for o in ok))}",
        )

    return level_lines("onelane", level, details)


def ttft_line(name: str, series: list[Streamed]) -> str:
    firsts = [s.ttft for s in series if s.ttft is not None and s.error is None]
    bad = Counter(s.error or "no content" for s in series if s.error or s.ttft is None)
    if not firsts:
        return f"{name} stream c=1: no successful stream of {len(series)} ({dict(bad)})"
    totals = [s.total for s in series if s.error is None]
    chunks = [s.content_chunks for s in series if s.error is None]
    return (
        f"{name} stream c=1: time to first content delta p50 {ms(pct(firsts, 50))} ms, p99 {ms(pct(firsts, 99))} ms;"
        f" whole stream p50 {ms(pct(totals, 50))} ms; content chunks/stream median {statistics.median(chunks):.0f}"
        f" (n={len(firsts)}, failed {sum(bad.values())}{' ' + str(dict(bad)) if bad else ''})"
    )


TABLE_COLUMNS = (
    "clients",
    "p50 ms",
    "p99 ms",
    "req/s",
    "tok/s",
    "TTFT p50 ms",
    "answered",
    "429/503 (Retry-After)",
    "no answer",
    "tok for gone clients",
    "busy after give-up s",
    "next 1-tok req s",
)


def table(
    rows: list[tuple[str, dict[str, Any], dict[str, Any]]],
    ttft: tuple[float | None, float | None],
    over: tuple[OverloadRow, OverloadRow] | None,
) -> list[str]:
    """One table; each cell is `onelane | the peer`."""
    body = [level_cells(name, a, b, ttft) for name, a, b in rows]
    if over is not None:
        body.append(["overload", *[""] * 5, *(pair(x, y) for x, y in zip(astuple(over[0]), astuple(over[1])))])
    widths = [max(len(c), *(len(r[i]) for r in body)) for i, c in enumerate(TABLE_COLUMNS)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) for c, w in zip(cells, widths))

    return [line(TABLE_COLUMNS), line(["-" * w for w in widths]), *map(line, body)]


def pair(a: Any, b: Any) -> str:
    return f"{a} | {b}"


def level_cells(name: str, a: dict[str, Any], b: dict[str, Any], ttft: tuple[float | None, float | None]) -> list[str]:
    """A level's row: each server's latency, requests and tokens per second (TTFT at 1 client); no overload cells."""

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    return [
        name,
        pair(ms(a["p50"]), ms(b["p50"])),
        pair(ms(a["p99"]), ms(b["p99"])),
        pair(num(a["rps"], ".1f"), num(b["rps"], ".1f")),
        pair(num(a["tps"], ".0f"), num(b["tps"], ".0f")),
        pair(ms(ttft[0]), ms(ttft[1])) if name == "1" else "",
        *[""] * 6,
    ]


def verdict(
    rows: list[tuple[str, dict[str, Any], dict[str, Any]]],
    spreads: dict[str, list[float]],
    ol_probe: dict[str, Any] | None,
    ab: Abandoned | None,
    mlx_probe: dict[str, Any] | None,
    peer: str = PEER,
) -> list[str]:
    """Where each is ahead, worded from the figures measured above (`peer`: the mlx_lm.server compared with)."""
    lines = []
    for name, a, b in rows:
        each = spreads.get(name) or []
        if each:
            ratio = statistics.median(each)
            who = "onelane" if ratio > 1.05 else peer if ratio < 1 / 1.05 else "neither (within 5%)"
            lines.append(
                f"c={name}: {who} ahead on throughput: onelane/{peer} median {ratio:.2f}x (min "
                f"{min(each):.2f}, max {max(each):.2f}, n={len(each)}; {a['tps']:.0f} vs {b['tps']:.0f} "
                f"tok/s); latency p50 {ms(a['p50'])} vs {ms(b['p50'])} ms, p99 {ms(a['p99'])} vs "
                f"{ms(b['p99'])} ms"
            )
    lines.append(
        f"Both batch: {peer} up to 32 sequences per decode step (--decode-concurrency 32), onelane up "
        "to ONELANE_MAX_BATCH jobs in its one worker's continuous batch."
    )
    if ol_probe is not None and mlx_probe is not None and ab is not None:
        rej = [o for o in ol_probe["outcomes"] if o.status in (429, 503)]
        mlx_rej = [o for o in mlx_probe["outcomes"] if o.status in (429, 503)]
        lines.append(
            f"Overload: onelane refused {len(rej)} of {OVERLOAD_CLIENTS} at once "
            f"({sum(1 for o in rej if o.retry_after)} with Retry-After); {peer} refused {len(mlx_rej)} "
            f"and took every request it could accept (listen backlog aside)."
        )
        lines.append(
            f"Work for departed clients: onelane spent {ab.tokens} tokens on jobs whose client timed out "
            f"({ab.started_after_gone} of those jobs started after the client had gone); {peer} "
            f"finished {mlx_probe['write_errors']} answers nobody read "
            f"({mlx_probe['write_errors'] * OVERLOAD_TOKENS} tokens)."
        )
        fa, fb = ol_probe["fresh_request"], mlx_probe["fresh_request"]
        if fa is not None and fb is not None:
            lines.append(
                f"The next user's 1-token request right after the burst: {fa.latency:.2f} s on onelane "
                f"({'ok' if fa.ok else fa.error}), {fb.latency:.2f} s on {peer} "
                f"({'ok' if fb.ok else fb.error})."
            )
    return lines


def renamed(lines: list[str], peer: str) -> list[str]:
    """Lines printed by streaming_load's and mlx_server's helpers, which name the peer `mlx_lm.server`, naming
    `peer` (e.g. mlx_lm.server+shim) instead."""
    return lines if peer == PEER else [line.replace(PEER, peer) for line in lines]


# --- main ----------------------------------------------------------------------------------------------------


def measure(
    settings: Settings, args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[int, list[MixLevel]]]:
    """The servers up (onelane, and mlx_lm.server on each BLAS of --peer-blas); every level `--rounds` times on
    each (and on the bare engine), the order rotating; TTFT; then the overload probes (onelane's with the peers
    idle, each peer's once onelane is stopped). Returns onelane's figures, each peer's by name, the bare engine's."""
    folder = Path(settings.var_dir)
    store = Store.connect(settings)
    sized = stack_env(args, settings)
    ol, peers, engine_levels = results(args.levels, peer_blas(args))
    engine = None if args.workload != "stream" or args.no_engine else bare_engine(settings.model_path)
    if engine is not None:
        ol["engine_blas"] = loaded_blas([os.getpid()])
    try:
        with contextlib.ExitStack() as onelane, contextlib.ExitStack() as peer_servers:
            servers, own = {}, {}
            for blas in peer_blas(args):
                name = PEER_NAMES[blas]
                log = folder / ("mlx-server.log" if len(peers) == 1 else f"mlx-server-{blas}.log")
                own[name] = peer_servers.enter_context(contextlib.ExitStack())  # (to stop it on its own)
                servers[name] = own[name].enter_context(mlx_server(settings.model_path, log, blas=blas, var_dir=folder))
                peers[name]["blas"] = loaded_blas([servers[name].process.pid])
            worker = onelane.enter_context(
                onelane_worker(settings, folder / "worker.log", **queue_bounds(BIG_QUEUE), **sized)
            )
            port = free_port()
            started = time.monotonic()
            with onelane_web(settings, port, folder / "web.log", ready="/readyz", **queue_bounds(BIG_QUEUE), **sized):
                ol["ready_s"] = time.monotonic() - started
                ol["blas"] = loaded_blas(sorted(group_members(worker.pid)))  # (ready: its worker has the model)
                sides = Sides(
                    args, settings, store, f"http://127.0.0.1:{port}", servers, engine, ol, peers, engine_levels
                )
                sides.warm_up()
                sides.rounds()
                sides.ttft()
                settle_queue(store)
            if not args.no_overload:
                ol["overload"], ol["abandoned"] = onelane_overload_phase(settings, store, sized)
            ol["alive"] = worker.poll() is None
            onelane.close()  # onelane stopped: each mlx_lm.server's probe runs alone (the other one idle)
            if not args.no_overload:
                for name, server in servers.items():  # each alone: one probed, then stopped, then the next
                    peers[name]["overload"] = overload_probe(server)
                    own[name].close()
        ol["log_problems"] = {
            name: matching_lines(folder / name, LOG_NEEDLES) for name in ("worker.log", "web.log", "web-overload.log")
        }
    finally:
        store.redis.close()
    return ol, peers, engine_levels


def peer_blas(args: argparse.Namespace) -> tuple[str, ...]:
    """The BLAS of each mlx_lm.server to compare with: --peer-blas, `both` being stock and shim."""
    return BLAS_CHOICES if args.peer_blas == "both" else (args.peer_blas,)


def stack_env(args: argparse.Namespace, settings: Settings) -> dict[str, str]:
    """What onelane's worker and web get beside the queue bounds: the batch, the prefill chunk, the prefix cache."""
    sized = {"ONELANE_MAX_BATCH": str(args.batch), "ONELANE_PREFILL_STEP": str(settings.prefill_step)}
    if args.no_prefix_cache:
        sized["ONELANE_PREFIX_CACHE"] = "0"
    return sized


def results(
    levels: list[int], blases: Sequence[str]
) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[int, list[MixLevel]]]:
    """Where onelane's figures go, each peer's (by its name, for each of `blases`), and the bare engine's, empty."""
    ol: dict[str, Any] = {
        "levels": {c: [] for c in levels},
        "unsettled": [],
        "overload": None,
        "abandoned": None,
        "ttft": [],
        "blas": "?",
        "engine_blas": None,
    }
    peers = {
        PEER_NAMES[blas]: {
            "levels": {c: [] for c in levels},
            "unsettled": [],
            "overload": None,
            "ttft": [],
            "asked": blas,
            "blas": "?",
        }
        for blas in blases
    }
    return ol, peers, {c: [] for c in levels}


@dataclass
class Sides:
    """The servers up, and the bare engine if there is one: each level of each round on every side, the order
    rotating, the figures into `ol` (onelane's), `peers` (each mlx_lm.server's, by name) and `engine_levels`."""

    args: argparse.Namespace
    settings: Settings
    store: Store
    url: str  # onelane's
    servers: dict[str, Any]  # mlx_server.Server, by the peer's name
    engine: Any
    ol: dict[str, Any]
    peers: dict[str, dict[str, Any]]
    engine_levels: dict[int, list[MixLevel]]

    def __post_init__(self) -> None:
        self.stream = self.args.workload == "stream"
        self.model = self.settings.model_name
        self.send_ol = http_sender(self.url, self.args.max_tokens, {"model": self.model})
        self.send_mlx = {name: http_sender(s.url, self.args.max_tokens, {}) for name, s in self.servers.items()}

    def warm_up(self) -> None:
        for prompt in PROMPTS[:2]:  # warm-up, as the baseline's
            warm = post_chat(self.url, onelane_body(self.model, prompt, 8), START_S)
            if not warm.ok:
                raise RuntimeError(f"warm-up request failed: {warm.error}")
        if self.engine is not None:  # its first batch pays for first-time allocations: not in a level
            self.engine_level([[PROMPTS[0]], [PROMPTS[1]]], frozenset(), 8)

    def rounds(self) -> None:
        sides = (
            self.on_onelane,
            *(functools.partial(self.on_mlx, name) for name in self.servers),
            *([self.on_engine] if self.engine is not None else []),
        )
        for r in range(self.args.rounds):
            for n, clients in enumerate(self.args.levels):
                for side in rotated(sides, r + n):
                    side(clients, r)

    def asks(self, clients: int, r: int) -> tuple[list[list[str]], frozenset[int]]:
        """Each client's prompts at a level, and which of them stream (streaming_load.client_plan)."""
        count, at = client_plan(clients, self.args.plain, self.args.streamed)
        return prompts(clients, r, count), at

    def on_onelane(self, clients: int, r: int) -> None:
        if self.stream:
            ask, at = self.asks(clients, r)
            level = counted(lambda: http_level("onelane", ask, at, self.send_ol))
        else:
            level = onelane_level(self.url, self.model, clients, self.args.max_tokens, self.args.requests)
        self.ol["levels"][clients].append(level)
        if not settle_queue(self.store):
            self.ol["unsettled"].append(clients)

    def on_mlx(self, name: str, clients: int, r: int) -> None:
        server = self.servers[name]
        if self.stream:
            ask, at = self.asks(clients, r)
            level = counted(lambda: http_level(name, ask, at, self.send_mlx[name]))
        else:
            level = load_level(server, clients, self.args.max_tokens, self.args.requests)
        self.peers[name]["levels"][clients].append(level)
        if not settle(server):
            self.peers[name]["unsettled"].append(clients)

    def on_engine(self, clients: int, r: int) -> None:
        ask, at = self.asks(clients, r)
        self.engine_levels[clients].append(self.engine_level(ask, at, self.args.max_tokens))

    def engine_level(self, ask: list[list[str]], at: frozenset[int], max_tokens: int) -> MixLevel:
        return engine_level(self.engine, ask, at, max_tokens, self.args.batch, self.settings.prefill_step)

    def ttft(self) -> None:
        """The ignore-eos workload's time to first token: one stream at a time, alternating the servers."""
        for i in range(0 if self.stream else TTFT_REQUESTS):
            prompt, max_tokens = PROMPTS[i % len(PROMPTS)], self.args.max_tokens
            request = onelane_body(self.model, prompt, max_tokens, stream=True)
            self.ol["ttft"].append(stream_once(self.url, request, REQUEST_TIMEOUT_S))
            for name, server in self.servers.items():
                peer = {**body(prompt, max_tokens, server.eos), "stream": True}
                self.peers[name]["ttft"].append(stream_once(server.url, peer, REQUEST_TIMEOUT_S))


def onelane_overload_phase(settings: Settings, store: Store, sized: dict[str, str]) -> tuple[dict[str, Any], Any]:
    """The onelane web restarted with small queue bounds for the overload probe: the probe, and what the worker did
    for the clients that had gone."""
    port = free_port()
    with onelane_web(
        settings,
        port,
        Path(settings.var_dir) / "web-overload.log",
        ready="/readyz",
        **queue_bounds(OVERLOAD_QUEUE),
        **sized,
    ):
        probe = onelane_overload(f"http://127.0.0.1:{port}", settings.model_name, store)
        return probe, abandoned(probe)


def bare_engine(model_path: str) -> Any:
    """worker/batch/engine.py's Engine on the model folder, in this process (on OpenBLAS: see main)."""
    from worker.batch.engine import Engine

    return Engine.load(model_path)


def counted(run: Any) -> MixLevel:
    """`run()`'s level, with the kernel's listen-queue overflows during it (system-wide: anything else on this
    machine counts too; mlx_lm.server listens with a backlog of 5)."""
    before = listen_overflows()
    level: MixLevel = run()
    after = listen_overflows()
    level.listen_overflows = None if before is None or after is None else after - before
    return level


def over_rounds(runs: list[Level]) -> dict[str, float | None]:
    """A level's figures, each the median over the rounds."""
    stats = [level_stats(level) for level in runs]
    return {
        k: statistics.median(v) if (v := [st[k] for st in stats if st[k] is not None]) else None
        for k in ("p50", "p99", "rps", "tps")
    }


def ratios(a: list[Level], b: list[Level]) -> list[float]:
    """onelane/mlx_lm.server throughput, round by round."""
    return [x["tps"] / y["tps"] for x, y in zip(map(level_stats, a), map(level_stats, b)) if x["tps"] and y["tps"]]


def report(
    args: argparse.Namespace,
    ol: dict[str, Any],
    peers: dict[str, dict[str, Any]],
    engine: dict[int, list[MixLevel]],
    load: float,
    wall: float,
) -> None:
    """The ignore-eos workload: each round's levels, TTFT, the overload probes, then one table per peer."""
    levels = args.levels
    print(
        f"onelane vs {' and '.join(peers)}: model {model_label(args)}, max_tokens {args.max_tokens}, temperature 0, "
        f"every answer forced to max_tokens (onelane: ignore_eos; mlx_lm.server: logit_bias against EOS), "
        f"non-streaming levels, {args.rounds} rounds alternating the servers; {os.cpu_count()} CPUs, load average "
        f"{load:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(
        f"onelane: ONELANE_MAX_BATCH={args.batch}; worker (supervised) + web (gunicorn gevent), ready in "
        f"{ol['ready_s']:.1f} s. {' and '.join(peers)}: --decode-concurrency 32 (its default)."
    )
    print("\n".join(blas_lines(ol, peers)))
    for r in range(args.rounds):
        print(f"\n-- round {r + 1}")
        for clients in levels:
            print("\n".join(onelane_level_lines(ol["levels"][clients][r], args.max_tokens)))
            for name, peer in peers.items():
                print("\n".join(renamed(mlx_level_lines(peer["levels"][clients][r]), name)))
    warn_unsettled(ol, peers, levels)
    print()
    print(ttft_line("onelane", ol["ttft"]))
    for name, peer in peers.items():
        print(ttft_line(name, peer["ttft"]))
    overload_report(ol, peers)
    for name, peer in peers.items():
        print()
        side_by_side(args, ol, name, peer)
    if len(peers) > 1:
        print()
        print("\n".join(peer_ratio_lines(args.levels, ol, peers, lambda level: level_stats(level)["tps"])))
    closing(ol, wall)


def blas_lines(ol: dict[str, Any], peers: dict[str, dict[str, Any]]) -> list[str]:
    """The BLAS each side ran on, read from its processes (bench/mlx_server.py loaded_blas)."""
    lines = [f"BLAS, read from each running process: onelane's worker: {ol['blas']}"]
    for name, peer in peers.items():
        lines.append(f"  {name} (--peer-blas {peer['asked']}): {peer['blas']}")
    if ol["engine_blas"] is not None:
        lines.append(f"  bare engine (this process): {ol['engine_blas']}")
    if any(peer["asked"] == "shim" for peer in peers.values()) and not Settings.from_env().gemv:
        lines.append(
            "  WARNING: ONELANE_GEMV=false: onelane's worker sends no product to the shim's kernel, mlx_lm.server's "
            "shim does (its built-in default, every product)"
        )
    return lines


def peer_ratio_lines(levels: list[int], ol: dict[str, Any], peers: dict[str, dict[str, Any]], tps: Any) -> list[str]:
    """With more than one peer: per level, onelane's tokens/s over each peer's, and each peer's over the first's
    (with --peer-blas both: what the shim does for mlx_lm.server), round by round, as median (min-max)."""
    first, *others = peers
    lines = ["tokens/s ratios against each peer, round by round, median (min-max) over the rounds:"]
    for c in levels:
        a = ol["levels"][c]
        cells = [
            f"onelane/{name} {span(Row.ratios(a, peer['levels'][c], tps), '{:.2f}')}x" for name, peer in peers.items()
        ]
        cells += [
            f"{name}/{first} {span(Row.ratios(peers[name]['levels'][c], peers[first]['levels'][c], tps), '{:.2f}')}x"
            for name in others
        ]
        lines.append(f"  c={c}: " + "; ".join(cells))
    return lines


def warn_unsettled(ol: dict[str, Any], peers: dict[str, dict[str, Any]], levels: list[int]) -> None:
    """The levels after which a server was still busy SETTLE_S later."""
    for clients in levels:
        if clients in ol["unsettled"]:
            print(f"onelane c={clients}: WARNING: queue not empty {SETTLE_S:.0f} s after a level ended")
        for name, peer in peers.items():
            if clients in peer["unsettled"]:
                print(f"{name} c={clients}: WARNING: still generating {SETTLE_S:.0f} s after a level ended")


def side_by_side(args: argparse.Namespace, ol: dict[str, Any], name: str, peer: dict[str, Any]) -> None:
    """The ignore-eos workload's medians over the rounds in one table, onelane against the peer `name`, then where
    each server is ahead."""
    rows = [(str(c), over_rounds(ol["levels"][c]), over_rounds(peer["levels"][c])) for c in args.levels]

    def p50_ttft(series: list[Streamed]) -> float | None:
        firsts = [s.ttft for s in series if s.ttft is not None and s.error is None]
        return pct(firsts, 50) if firsts else None

    over = None
    if ol["overload"] is not None and peer["overload"] is not None:
        over = (
            overload_row(ol["overload"], ol["abandoned"].tokens),
            overload_row(peer["overload"], peer["overload"]["write_errors"] * OVERLOAD_TOKENS),
        )
    print(
        f"side by side, each cell `onelane | {name}` ({name}: {peer['blas']}), medians over {args.rounds} rounds "
        f"(tok for gone clients: onelane = completion tokens of jobs whose client timed out, from Redis; {name} = "
        f"answers finished for closed sockets x {OVERLOAD_TOKENS}, from its log)"
    )
    print("\n".join(table(rows, (p50_ttft(ol["ttft"]), p50_ttft(peer["ttft"])), over)))
    print()
    spreads = {str(c): ratios(ol["levels"][c], peer["levels"][c]) for c in args.levels}
    print("\n".join(verdict(rows, spreads, ol["overload"], ol["abandoned"], peer["overload"], name)))


def overload_report(ol: dict[str, Any], peers: dict[str, dict[str, Any]]) -> None:
    if ol["overload"] is not None:
        print()
        print("\n".join(onelane_overload_lines(ol["overload"], ol["abandoned"])))
    for name, peer in peers.items():
        if peer["overload"] is not None:
            print()
            print("\n".join(f"{name} {line}" for line in overload_lines(peer["overload"])))


def closing(ol: dict[str, Any], wall: float) -> None:
    problems = {name: lines for name, lines in ol["log_problems"].items() if lines}
    print()
    print(
        f"onelane worker alive at the end: {ol['alive']}; error lines in onelane's logs: "
        + (", ".join(f"{n}: {len(v)}" for n, v in problems.items()) or "none")
    )
    for name, lines in problems.items():
        for line in lines[:5]:
            print(f"  {name}: {line[:300]}")
    print(f"total {time.monotonic() - wall:.1f} s")


def stream_report(
    args: argparse.Namespace,
    ol: dict[str, Any],
    peers: dict[str, dict[str, Any]],
    engine: dict[int, list[MixLevel]],
    load: float,
    wall: float,
) -> None:
    """The streaming workload: each round's levels, the overload probes, then per level and per peer the medians
    and ratios."""
    levels = args.levels
    n = args.plain + args.streamed
    print(
        f"onelane vs {' and '.join(peers)}, streaming workload: model {model_label(args)}; closed-loop clients, each "
        f"sending {args.plain} plain and {args.streamed} streamed chat requests (requests {sorted(i + 1 for i in streamed_at(args.plain, args.streamed))} "
        f"of {n} stream; at a level of fewer than {MIN_LEVEL_REQUESTS} requests in all, each client sends its {n} again, until it has) of prompts of its own, temperature 0, natural stops, max_tokens {args.max_tokens}, a fresh "
        f"connection each; {args.rounds} rounds, the order rotating; {os.cpu_count()} CPUs, load average {load:.2f} "
        f"before, {os.getloadavg()[0]:.2f} after"
    )
    print(
        f"onelane: ONELANE_MAX_BATCH={args.batch}, prefix cache {'off' if args.no_prefix_cache else 'on'}; worker "
        f"(supervised) + web (gunicorn gevent), ready in {ol['ready_s']:.1f} s. {' and '.join(peers)}: "
        "--decode-concurrency 32 (its default), its prompt cache on. "
        + ("No bare engine (--no-engine)." if args.no_engine else "Bare engine: this process, the same batch bound.")
    )
    print("\n".join(blas_lines(ol, peers)))
    print("TTFT: from sending the request (connecting included) to the first non-empty content chunk.")
    for r in range(args.rounds):
        print(f"\n-- round {r + 1}")
        for clients in levels:
            for side in (ol["levels"][clients], *(p["levels"][clients] for p in peers.values()), engine[clients]):
                if len(side) > r:
                    print("\n".join(mix_level_lines(side[r])))
    warn_unsettled(ol, peers, levels)
    overload_report(ol, peers)
    for i, (name, peer) in enumerate(peers.items()):
        # (the bare engine's lines, queue efficiency, do not depend on the peer: with the first peer only)
        rows = [Row(c, ol["levels"][c], peer["levels"][c], engine[c] if i == 0 else []) for c in levels]
        print(
            f"\nonelane vs {name} (BLAS: {peer['blas']}), per level over {args.rounds} rounds: median (min-max); ratios round by round"
        )
        print("\n".join(renamed(summary_lines(rows, args.rounds), name)))
        print()
        print("\n".join(markdown(rows)))
    if len(peers) > 1:
        print()
        print("\n".join(peer_ratio_lines(levels, ol, peers, lambda level: level.tps)))
    print()
    closing(ol, wall)


def model_label(args: argparse.Namespace) -> str:
    return {"smollm2": "SmolLM2-135M-Instruct (float32)", "demo": "worker/demo", "random": f"random, {args.size}"}.get(
        args.model, args.model
    )


def main() -> None:
    args = parse_args()
    stream = args.workload == "stream"
    if stream and not args.no_engine:
        preload_openblas()  # the bare engine runs in this process: on the BLAS onelane's workers get
    wall, load = time.monotonic(), os.getloadavg()[0]
    with bench_env(args.size, None if args.model == "random" else args.model) as settings:
        ol, peers, engine = measure(settings, args)
    (stream_report if stream else report)(args, ol, peers, engine, load, wall)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model",
        default="smollm2",
        help="the model folder both servers load: smollm2 (the default model, imported as float32), demo "
        "(worker/demo), random (a random model of --size), or a folder",
    )
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"], help="of --model random")
    parser.add_argument(
        "--workload",
        default="stream",
        choices=["stream", "ignore-eos"],
        help="stream: plain and streamed requests, natural stops (issue 33); ignore-eos: non-streaming, every answer "
        "max_tokens long, TTFT at 1 client",
    )
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrent clients, comma-separated")
    parser.add_argument(
        "--max-tokens", type=int, help=f"default {STREAM_MAX_TOKENS} (stream), {MAX_TOKENS} (ignore-eos)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="each level this many times on each server")
    parser.add_argument("--plain", type=int, default=PLAIN, help="plain requests per client per level (stream)")
    parser.add_argument(
        "--streamed", type=int, default=STREAMED, help="streamed requests per client per level (stream)"
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=MIN_REQUESTS,
        help="requests per level (ignore-eos; at least 2 per client); fewer for a slow model",
    )
    parser.add_argument("--no-engine", action="store_true", help="no bare engine, no queue efficiency (stream)")
    parser.add_argument("--no-prefix-cache", action="store_true", help="onelane with ONELANE_PREFIX_CACHE=0")
    parser.add_argument("--no-overload", action="store_true")
    parser.add_argument("--batch", type=int, default=Settings().max_batch, help="onelane's ONELANE_MAX_BATCH")
    parser.add_argument(
        "--peer-blas",
        default="shim",
        choices=[*BLAS_CHOICES, "both"],
        help="mlx_lm.server's BLAS: shim (the default: OpenBLAS with onelane's shim ahead of it, the preload onelane's "
        "worker gets; listed as mlx_lm.server+shim), stock (OpenBLAS alone; listed as mlx_lm.server), or both (two "
        "peers, each in every round)",
    )
    args = parser.parse_args()
    args.levels = [int(c) for c in args.levels.split(",")]
    if args.max_tokens is None:
        args.max_tokens = STREAM_MAX_TOKENS if args.workload == "stream" else MAX_TOKENS
    return args


if __name__ == "__main__":
    main()
