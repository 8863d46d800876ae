"""The streaming, natural-stop chat workload (issue 33), the same against onelane, mlx_lm.server and the bare engine:
closed-loop clients, each sending its own prompts back to back, some plain and some streamed (temperature 0, EOS
allowed, `max_tokens` a cap), as a chat UI's users do while others are decoding. What a level shows: completion
tokens/s over its wall time, time to the first content chunk of the streamed requests (percentiles), and the
requests that failed, by kind (a reset connection is counted, never retried or hidden).

Used by bench/compare_servers.py; the bare engine is driven as bench.harness.generate drives it, with every
client's sequence in one batch (`engine_level`)."""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bench.openai_load import PROMPTS, post_chat, stream_once
from bench.report import ms, pct, span
from tasks.job import JobSpec, Message, SamplingParams

MAX_TOKENS = 32
PLAIN, STREAMED = 5, 2  # requests per client per level
LEVEL_DEADLINE_S = 900.0  # no request starts later than this into a level
REQUEST_TIMEOUT_S = 300.0  # a slow model at 32 clients is slow, not failed
STEPS_CAP = 1_000_000  # the bare engine's loop, bounded
KINDS = (  # how stream_once and post_chat name a failure -> one short kind
    ("ConnectionReset", "reset"),
    ("reset", "reset"),
    ("BrokenPipe", "reset"),
    ("RemoteDisconnected", "disconnected"),
    ("disconnected", "disconnected"),
    ("Refused", "refused"),
    ("refused", "refused"),
    ("imeout", "timeout"),
    ("too slow", "timeout"),
)


def prompts(clients: int, round_no: int, per_client: int) -> list[list[str]]:
    """Each client's prompts: its own (its number, the level and the round open them, so no cache serves one
    client's prompt from another's or from an earlier level), none repeated within a client (past len(PROMPTS), a
    pass number opens them too)."""
    return [[_prompt(c, clients, round_no, i) for i in range(per_client)] for c in range(clients)]


def _prompt(c: int, clients: int, round_no: int, i: int) -> str:
    again = f", pass {i // len(PROMPTS) + 1}" if i >= len(PROMPTS) else ""
    return f"Reader {c + 1} of {clients}, round {round_no + 1}{again}: {PROMPTS[(c + i) % len(PROMPTS)]}"


def client_plan(clients: int, plain: int, streamed: int) -> tuple[int, frozenset[int]]:
    """How many requests each client sends at a level of `clients`, and which of them stream: its `plain` and
    `streamed` as one sequence, sent again until the level has at least MIN_LEVEL_REQUESTS (one client alone sends
    it 3 times: 7 requests are too few a sample on a noisy machine)."""
    n = plain + streamed
    passes = max(1, math.ceil(MIN_LEVEL_REQUESTS / (clients * n)))
    return passes * n, frozenset(i + p * n for p in range(passes) for i in streamed_at(plain, streamed))


MIN_LEVEL_REQUESTS = 21  # a level sends at least this many requests in all (client_plan)


def streamed_at(plain: int, streamed: int) -> frozenset[int]:
    """Which of a client's requests stream: spread among the plain ones (5 and 2: the 3rd and the 5th), so that a
    stream starts while the other clients are decoding."""
    n = plain + streamed
    return frozenset(math.floor((k + 1) * n / (streamed + 1)) for k in range(streamed))


def failure_kind(error: str | None) -> str | None:
    """A failure's short kind: reset, disconnected, refused, timeout, http N, or the error's own name."""
    if error is None:
        return None
    return next((kind for needle, kind in KINDS if needle in error), error)


def connection_failure(kind: str) -> bool:
    """A failure of the connection itself (not an answer the server chose to give)."""
    return kind in ("reset", "disconnected", "refused", "timeout") or kind.endswith("Error")


@dataclass
class Sent:
    """One request as it went: whether it streamed, ok or the kind of its failure, its time to the end and (streamed)
    to the first content chunk, and the tokens its usage reported."""

    streamed: bool
    ok: bool
    failure: str | None
    latency: float
    ttft: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    finish_reason: str | None = None


@dataclass
class MixLevel:
    """One server's (or the bare engine's) level: every request, the wall time, and what else was seen."""

    server: str
    clients: int
    sent: list[Sent] = field(default_factory=list)
    wall_s: float = 0.0
    listen_overflows: int | None = None  # the kernel's, system-wide, during the level (Linux)

    @property
    def ok(self) -> list[Sent]:
        return [s for s in self.sent if s.ok]

    @property
    def failures(self) -> Counter[str]:
        return Counter(s.failure or "?" for s in self.sent if not s.ok)

    @property
    def tps(self) -> float | None:
        return sum(s.completion_tokens for s in self.ok) / self.wall_s if self.wall_s and self.ok else None

    @property
    def ttfts(self) -> list[float]:
        return [s.ttft for s in self.ok if s.streamed and s.ttft is not None]

    def ttft(self, q: float) -> float | None:
        return pct(self.ttfts, q) if self.ttfts else None


# --- the HTTP servers ----------------------------------------------------------------------------------------


def http_sender(url: str, max_tokens: int, extra: dict[str, Any]) -> Callable[[str, bool], Sent]:
    """Send one chat request of the workload to `url` (a fresh connection each, as a new user's client opens),
    plain or streamed with its usage; `extra`: fields only this server gets (onelane's `model`)."""

    def send(prompt: str, streamed: bool) -> Sent:
        request = {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            **extra,
        }
        if not streamed:
            o = post_chat(url, {**request, "stream": False}, REQUEST_TIMEOUT_S)
            return Sent(
                False,
                o.ok,
                failure_kind(o.error),
                o.latency,
                None,
                o.completion_tokens,
                o.prompt_tokens,
                o.finish_reason,
            )
        s = stream_once(url, {**request, "stream": True, "stream_options": {"include_usage": True}}, REQUEST_TIMEOUT_S)
        usage = s.usage or {}
        tokens = int(usage.get("completion_tokens", s.content_chunks))  # chunks: a server that sends no usage
        return Sent(
            True, s.error is None, failure_kind(s.error), s.total, s.ttft, tokens, int(usage.get("prompt_tokens", 0))
        )

    return send


def http_level(
    server: str, clients: list[list[str]], at: frozenset[int], send: Callable[[str, bool], Sent]
) -> MixLevel:
    """Every client at once, each sending its prompts back to back (streamed at `at`), none started after
    LEVEL_DEADLINE_S."""
    deadline = time.monotonic() + LEVEL_DEADLINE_S

    def client(own: list[str]) -> list[Sent]:
        return [send(p, i in at) for i, p in enumerate(own) if time.monotonic() < deadline]

    level = MixLevel(server, len(clients))
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(clients)) as pool:
        for future in [pool.submit(client, own) for own in clients]:
            level.sent.extend(future.result())
    level.wall_s = time.monotonic() - started
    return level


# --- the bare engine -----------------------------------------------------------------------------------------


@dataclass
class _Live:
    client: int
    n: int  # which of the client's requests
    started: float
    first: float | None = None
    tokens: int = 0
    prompt_tokens: int = 0

    def ended(self, streamed: bool, now: float, reason: str) -> Sent:
        """The request as it went, ended at `now` for `reason` (TTFT: from its insert to its first token)."""
        ttft = None if self.first is None else self.first - self.started
        return Sent(streamed, True, None, now - self.started, ttft, self.tokens, self.prompt_tokens, reason)


def engine_level(
    engine: Any, clients: list[list[str]], at: frozenset[int], max_tokens: int, max_batch: int, prefill_step: int
) -> MixLevel:
    """The same clients on worker/batch/engine.py's Engine alone, in this process, holding its lock as the worker does:
    every client's first request inserted together, and each client's next one as soon as its last ended (closed
    loop, no queue, no web, no Redis). Batch and prefill chunk as onelane's worker gets them. TTFT here: from the
    insert (the prompt tokenized) to the sequence's first token."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    level = MixLevel("engine", len(clients))
    live: dict[int, _Live] = {}

    def insert(c: int, n: int) -> None:
        spec = JobSpec(owner="bench", model="m", messages=(Message(role="user", content=clients[c][n]),), params=params)
        started = time.monotonic()
        tokens = engine.prompt_tokens(spec)
        live[engine.insert(tokens, params)] = _Live(c, n, started, prompt_tokens=len(tokens))

    with engine.lock:
        engine.configure(max_batch, prefill_step)
        try:
            started = time.monotonic()
            for c in range(len(clients)):
                insert(c, 0)
            for _ in range(STEPS_CAP):
                if not live:
                    break
                for t in engine.step():
                    seq = live[t.uid]
                    seq.tokens += 1
                    seq.first = seq.first or time.monotonic()
                    if t.finish_reason is None:
                        continue
                    del live[t.uid]
                    now = time.monotonic()
                    level.sent.append(seq.ended(seq.n in at, now, t.finish_reason))
                    if seq.n + 1 < len(clients[seq.client]) and now - started < LEVEL_DEADLINE_S:
                        insert(seq.client, seq.n + 1)
            level.wall_s = time.monotonic() - started
        finally:
            engine.reset()
    return level


# --- printing ------------------------------------------------------------------------------------------------


def level_lines(level: MixLevel) -> list[str]:
    """One level of one round, as it went."""
    head = f"{level.server} c={level.clients}:"
    plain = [s for s in level.sent if not s.streamed]
    ok = level.ok
    fails = ", ".join(f"{k} {n}" for k, n in level.failures.most_common()) or "none"
    conn = sum(n for k, n in level.failures.items() if connection_failure(k))
    lines = [
        f"{head} sent {len(level.sent)} ({len(plain)} plain, {len(level.sent) - len(plain)} streamed), ok {len(ok)}, "
        f"failed {len(level.sent) - len(ok)} ({fails}; of them connection errors/resets {conn})"
        + ("" if level.listen_overflows is None else f"; kernel listen overflows {level.listen_overflows}")
    ]
    if not ok:
        return lines
    tokens = sum(s.completion_tokens for s in ok)
    finishes = Counter(s.finish_reason for s in ok if not s.streamed and s.finish_reason)
    lines.append(
        f"{head} {level.tps:.1f} completion tok/s ({tokens} tokens over {level.wall_s:.2f} s); streamed TTFT p50 "
        f"{ms(level.ttft(50))}, p90 {ms(level.ttft(90))}, p99 {ms(level.ttft(99))} ms (n={len(level.ttfts)}); "
        f"request p50 {ms(pct([s.latency for s in ok], 50))} ms; tokens/answer median "
        f"{statistics.median(s.completion_tokens for s in ok):.0f}; prompt tokens/request median "
        f"{statistics.median(s.prompt_tokens for s in ok):.0f}; plain answers' finish {dict(finishes) or '-'}"
    )
    return lines


@dataclass
class Row:
    """One level over the rounds: each figure per round, in round order."""

    clients: int
    onelane: list[MixLevel]
    peer: list[MixLevel]
    engine: list[MixLevel]

    @staticmethod
    def each(levels: list[MixLevel], figure: Callable[[MixLevel], float | None]) -> list[float]:
        return [v for level in levels if (v := figure(level)) is not None]

    @staticmethod
    def ratios(a: list[MixLevel], b: list[MixLevel], figure: Callable[[MixLevel], float | None]) -> list[float]:
        return [x / y for p, q in zip(a, b) if (x := figure(p)) is not None and (y := figure(q))]


def summary_lines(rows: list[Row], rounds: int) -> list[str]:
    """Per level: each figure's median over the rounds with its min-max, and the ratios round by round."""
    lines = []
    for row in rows:
        o, p, e = row.onelane, row.peer, row.engine
        tps = lambda lv: lv.tps  # noqa: E731
        lines.append(
            f"c={row.clients}: tok/s onelane {span(Row.each(o, tps), '{:.1f}')}, mlx_lm.server "
            f"{span(Row.each(p, tps), '{:.1f}')} -> onelane/peer {span(Row.ratios(o, p, tps), '{:.2f}')}x"
        )
        for q in (50, 90, 99):
            t = lambda lv, q=q: lv.ttft(q)  # noqa: E731
            lines.append(
                f"      streamed TTFT p{q}: onelane {span([v * 1000 for v in Row.each(o, t)], '{:.0f}')} ms, "
                f"mlx_lm.server {span([v * 1000 for v in Row.each(p, t)], '{:.0f}')} ms -> onelane/peer "
                f"{span(Row.ratios(o, p, t), '{:.2f}')}x"
            )
        for name, levels in (("onelane", o), ("mlx_lm.server", p)):
            pooled = [t for lv in levels for t in lv.ttfts]
            failed = sum(len(lv.sent) - len(lv.ok) for lv in levels)
            conn = sum(n for lv in levels for k, n in lv.failures.items() if connection_failure(k))
            lines.append(
                f"      {name}: all {rounds} rounds pooled, streamed TTFT p50 {ms(pct(pooled, 50) if pooled else None)}, "
                f"p90 {ms(pct(pooled, 90) if pooled else None)}, p99 {ms(pct(pooled, 99) if pooled else None)} ms "
                f"(n={len(pooled)}); failed {failed} of {sum(len(lv.sent) for lv in levels)}, connection "
                f"errors/resets {conn}"
            )
        if e:
            lines.append(
                f"      queue efficiency (onelane tok/s over the bare engine's, same prompts and batch): bare engine "
                f"{span(Row.each(e, tps), '{:.1f}')} tok/s -> {span(Row.ratios(o, e, tps), '{:.2f}')}x; bare engine "
                f"TTFT (insert to first token) p50 {span([v * 1000 for v in Row.each(e, lambda lv: lv.ttft(50))], '{:.0f}')} ms"
            )
    return lines


def markdown(rows: list[Row]) -> list[str]:
    """The table for a README: medians over the rounds, ratios as median (min-max)."""
    tps = lambda lv: lv.tps  # noqa: E731
    head = "| clients | tok/s onelane / peer | streamed TTFT p50 onelane / peer | TTFT p90 | TTFT p99 | failed onelane / peer |"
    sep = "|---|---|---|---|---|---|"
    if any(row.engine for row in rows):
        head, sep = head + " queue efficiency |", sep + "---|"
    lines = [head, sep]
    for row in rows:
        o, p = row.onelane, row.peer

        def ttft(q: int) -> str:
            t = lambda lv: lv.ttft(q)  # noqa: E731
            a, b = Row.each(o, t), Row.each(p, t)
            if not a or not b:
                return "-"
            return (
                f"{statistics.median(a) * 1000:.0f} / {statistics.median(b) * 1000:.0f} ms "
                f"({span(Row.ratios(o, p, t), '{:.2f}')}×)"
            )

        failed = [sum(len(lv.sent) - len(lv.ok) for lv in side) for side in (o, p)]
        sent = [sum(len(lv.sent) for lv in side) for side in (o, p)]
        cells = [
            str(row.clients),
            f"{span(Row.ratios(o, p, tps), '{:.2f}')}×",
            ttft(50),
            ttft(90),
            ttft(99),
            f"{failed[0]} of {sent[0]} / {failed[1]} of {sent[1]}",
        ]
        if row.engine:
            cells.append(f"{span(Row.ratios(o, row.engine, tps), '{:.2f}')}×")
        lines.append("| " + " | ".join(cells) + " |")
    return lines
