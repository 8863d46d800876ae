"""Speculation (prompt lookup) on copy-heavy and free work: onelane with it on, onelane with it off, mlx_lm.server;
same machine, same run, same model folder, same prompts, same request counts.

    ./dev.sh bench speculation [--model smollm2|demo|PATH] [--levels 1,8,32] [--rounds 3] [--max-tokens N]
                               [--workloads edit,quote,json,chat] [--requests 3] [--peer-blas shim|stock]
                               [--budget-s S]

A quick run, then a fuller one:

    .venv/bin/python -m bench.speculation --levels 1 --rounds 1 --max-tokens 64 --workloads edit
    .venv/bin/python -m bench.speculation --levels 1,8 --rounds 2

`--model smollm2` (the default) is SmolLM2-135M-Instruct imported from its GGUF as float32 into the run's folder,
the folder every server loads.

1. The servers up side by side, each idle while another is measured:
   - `onelane, spec on`: `onelane worker` (supervised) + `onelane web` on a private Redis, ONELANE_SPECULATE and
     ONELANE_SPECULATE_BUDGET at their defaults (set explicitly, whatever this environment says);
   - `onelane, spec off`: a second worker + web pair on a second private Redis, the same model folder,
     ONELANE_SPECULATE=0 (two pairs up at once rather than one restarted between: no restart inside a round, and
     each pair's prefix cache sees only its own prompts);
   - `mlx_lm.server` (bench/mlx_server.py), on the BLAS of `--peer-blas`: `shim` (the default) is the preload
     onelane's worker gets, OpenBLAS with onelane's shim ahead of it, so the ratio is the servers' and not the
     shim's. Its `--draft-model` is not used: no draft model of the target's tokenizer exists offline (one line says
     so); vllm-mlx and Rapid-MLX are not installed (no wheels offline; one line says what importlib finds).
   Both onelane pairs get queue bounds of 1000, so nothing is rejected.
2. Four workloads, each a set of prompts generated here (seeded by workload, round, level, client and request: no
   two requests alike, none repeated across rounds or servers' rounds), temperature 0, natural stops, max_tokens
   `--max-tokens`, through POST /v1/chat/completions, a fresh connection each:
   - edit: a 60-line Python source file, "rename the function X to Y and return the whole file";
   - quote: a retrieved document of ~40 lines of prose and a question, "answer quoting the relevant sentences
     verbatim";
   - json: a JSON document of ~40 lines, "return it with the field F changed to V, nothing else";
   - chat: open questions, little to copy.
3. For each of `--rounds` rounds, each workload and each level (`--levels` closed-loop clients, each sending
   `--requests` requests back to back, `--streamed` of them (all but one by default) streamed for their time to
   first content chunk and their decode rate, tokens after the first over the time after it): every server in
   turn, the order rotating, so a disturbance of this shared machine falls on all alike. After each level the server
   is let settle (onelane: its queue empty, then one lease period so that its step counter is in /metrics).
4. Per server x workload x level: completion tokens/s over the level's wall time (prompts read included), streamed
   TTFT p50 and decode rate (median); for the two onelane pairs the /metrics deltas over the level: tokens proposed
   and accepted (acceptance = accepted/proposed), tokens generated and batch steps, the worker's seconds reading
   prompts and drawing tokens (the prompts' share is what speculation cannot shorten). Tokens per step: a
   sequence's (generated / (generated - accepted): every step gives a sequence one token plus what it kept) and the
   batch's (generated / batch steps, every row's tokens).
   Then per workload x level the medians over the rounds with min-max, and the ratios on/off and on/mlx_lm.server
   round by round (median, min-max).
5. Answers: every prompt went to both onelane pairs; greedy, speculation must not change a token. The plain
   answers' texts are read back from GET /v1/jobs/{id} (`output`; its `timings` give the job's proposed and accepted
   tokens), the streamed ones' from their streams; every prompt answered by both is compared, and the mismatches
   counted and printed (there should be none).

Loopback only; every loop is bounded in count and time (a level starts no request after streaming_load's
LEVEL_DEADLINE_S, and no level starts after `--budget-s`); every process started here is stopped before the script
returns. Every figure printed is measured in this run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import re
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from bench.harness import (
    START_S,
    bench_env,
    matching_lines,
    onelane_stack,
    private_redis,
    queue_bounds,
    rotated,
)
from bench.mlx_server import BLAS_CHOICES, Server, loaded_blas, mlx_server, settle
from bench.onelane_overload import settle_queue
from bench.openai_load import post_chat, stream_once
from bench.proc import group_members
from bench.report import ms, span
from bench.streaming_load import (
    REQUEST_TIMEOUT_S,
    MixLevel,
    Row,
    Sent,
    failure_kind,
    http_level,
    streamed_at,
)
from tasks.settings import Settings
from tasks.store import Store

ON, OFF, PEER = "onelane, spec on", "onelane, spec off", "mlx_lm.server"
WORKLOADS = ("edit", "quote", "json", "chat")
LEVELS = (1, 8, 32)
MAX_TOKENS = 256
REQUESTS = 3  # per client per level: one of them streamed
LEASE_WAIT_S = Settings.model_fields["lease_s"].default + 0.5  # the worker adds its steps to /metrics each lease
LOG_NEEDLES = ("Traceback", " ERROR ", " CRITICAL ")
METRICS = {
    "proposed": "onelane_model_tokens_proposed_total",
    "accepted": "onelane_model_tokens_accepted_total",
    "generated": "onelane_tokens_generated_total",
    "steps": "onelane_batch_steps_total",
    "prefill_s": "onelane_prefill_seconds_total",  # the worker's time reading prompts ...
    "decode_s": "onelane_decode_seconds_total",  # ... and drawing tokens (with prefill: its step time)
}


# --- the workloads: prompts generated here, seeded ------------------------------------------------------------

NOUNS = "order invoice ledger parcel route ticket sensor reading batch record window queue budget client report".split()
VERBS = "load parse check merge split count render score filter build send store fetch clean sort".split()
ADJECTIVES = "quiet steady early late narrow broad fresh stale plain rough gentle bright hollow silent".split()
PLACES = "Aldermoor Brackenfield Corriewater Dunmere Elderbrook Farrowdale Glenhollow Harrowgate Ivybridge".split()
PEOPLE = "Ada Brennan, Tomas Okafor, Lena Vasquez, Miriam Holt, Oskar Lindqvist, Priya Raman, Jonah Ellery".split(", ")
THINGS = "the town hall,the old mill,the river bridge,the north library,the railway station,the market square".split(
    ","
)
OPEN_QUESTIONS = [
    "What makes a {a} morning worth getting up for?",
    "Why do people enjoy stories about a {a} {n}?",
    "If you could redesign the way a {n} works, what would you change and why?",
    "What advice would you give someone who wants to {v} things more carefully?",
    "Describe a {a} place you would like to visit, and what you would do there.",
    "What is the most useful habit for someone who has to {v} many things a day?",
    "How would you explain the idea of a {n} to a child?",
    "What do you think about when you hear the word '{a}'?",
]


def edit_prompt(rng: random.Random) -> str:
    """A 60-line Python file (a module docstring, an import, eight functions each calling the one before, a main)
    and the renaming of one function that is called elsewhere in it."""
    names = rng.sample([f"{v}_{n}" for v in VERBS for n in NOUNS], 8)
    lines = [f'"""Helpers for the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} service."""', "", "import math", ""]
    for i, name in enumerate(names):
        arg = rng.choice(NOUNS)
        call = f"{names[i - 1]}({arg}s[:limit])" if i else "limit"
        lines += [
            f"def {name}({arg}s, limit={rng.randint(2, 99)}):",
            f"    total = sum(len(str(x)) for x in {arg}s)",
            "    if total > limit:",
            f"        return {call} + {rng.randint(1, 9)}",
            f"    return math.ceil(total / {rng.randint(2, 9)})",
            "",
        ]
    lines += ["def main():", f"    items = list(range({rng.randint(10, 500)}))"]
    lines += [f"    print({name}(items[{rng.randint(0, 9)}:]))" for name in rng.sample(names, 6)]
    old = names[rng.randrange(7)]  # one that the next function calls
    new = f"{rng.choice(VERBS)}_{rng.choice(ADJECTIVES)}_{rng.choice(NOUNS)}"
    source = "\n".join(lines)
    assert len(lines) == 60
    return (
        f"Here is a Python file:\n\n```python\n{source}\n```\n\nRename the function `{old}` to `{new}` everywhere "
        "in it and return the whole file, nothing else."
    )


def quote_prompt(rng: random.Random) -> str:
    """A retrieved document of ~40 lines of prose about a made-up town, and a question one of its sentences
    answers."""
    town = rng.choice(PLACES)
    facts = []
    for _ in range(40):
        thing, person, year = rng.choice(THINGS), rng.choice(PEOPLE), rng.randint(1700, 1990)
        facts.append(
            rng.choice(
                [
                    f"In {year}, {person} oversaw the rebuilding of {thing} in {town} after a {rng.choice(ADJECTIVES)} winter.",
                    f"The records of {thing} list {rng.randint(3, 400)} {rng.choice(NOUNS)}s kept there by {person} in {year}.",
                    f"Visitors to {town} often remark that {thing} looks {rng.choice(ADJECTIVES)} in the evening light.",
                    f"{person} wrote in {year} that {thing} needed a new {rng.choice(NOUNS)} every {rng.randint(2, 12)} years.",
                ]
            )
        )
    asked = rng.choice([f for f in facts if any(p in f for p in PEOPLE)])
    who = next(p for p in PEOPLE if p in asked)
    document = "\n".join(facts)
    return (
        f"Document about {town}:\n\n{document}\n\nQuestion: what does the document say about {who}? Answer by quoting "
        "the relevant sentences verbatim, one per line."
    )


def json_prompt(rng: random.Random) -> str:
    """A JSON document of ~40 lines and one field to change."""
    doc: dict[str, Any] = {
        "id": rng.randint(10_000, 99_999),
        "name": f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}",
        "owner": rng.choice(PEOPLE),
        "town": rng.choice(PLACES),
        "active": rng.choice([True, False]),
        "limits": {n: rng.randint(1, 999) for n in rng.sample(NOUNS, 6)},
        "tags": rng.sample(ADJECTIVES, 5),
        "steps": [{"verb": v, "weight": round(rng.random(), 3)} for v in rng.sample(VERBS, 5)],
    }
    text = json.dumps(doc, indent=2)
    key = rng.choice(list(doc["limits"]))
    value = rng.randint(1000, 9999)
    return (
        f"Here is a JSON document:\n\n{text}\n\nReturn this JSON document with the field `limits.{key}` changed to "
        f"{value}, nothing else."
    )


def chat_prompt(rng: random.Random) -> str:
    """An open question: little in the prompt to copy."""
    return rng.choice(OPEN_QUESTIONS).format(a=rng.choice(ADJECTIVES), n=rng.choice(NOUNS), v=rng.choice(VERBS))


MAKERS: dict[str, Callable[[random.Random], str]] = {
    "edit": edit_prompt,
    "quote": quote_prompt,
    "json": json_prompt,
    "chat": chat_prompt,
}


def workload_prompts(workload: str, clients: int, round_no: int, per_client: int) -> list[list[str]]:
    """Each client's prompts of `workload` at a level of `clients` in round `round_no`, seeded by all of them (a
    str seed is hashed the same in every run); a first line names the request, so that no two are alike."""
    return [
        [
            f"(request {c + 1}.{i + 1} of {clients} clients, round {round_no + 1})\n"
            + MAKERS[workload](random.Random(f"{workload}/{round_no}/{clients}/{c}/{i}"))
            for i in range(per_client)
        ]
        for c in range(clients)
    ]


# --- the servers ---------------------------------------------------------------------------------------------


@dataclass
class Side:
    """One server as measured: its URL, what its requests add, how it settles, and its figures."""

    name: str
    url: str
    extra: dict[str, Any]
    settle: Callable[[], bool]
    store: Store | None = None  # onelane's
    blas: str = "?"
    levels: dict[tuple[str, int], list[MixLevel]] = field(default_factory=dict)
    counts: dict[tuple[str, int], list[dict[str, float]]] = field(default_factory=dict)  # /metrics deltas
    answers: dict[str, str | None] = field(default_factory=dict)  # prompt -> text (onelane)
    jobs: dict[str, str] = field(default_factory=dict)  # prompt -> job id (onelane, plain requests)
    unsettled: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def onelane(self) -> bool:
        return self.store is not None


def sender(side: Side, max_tokens: int) -> Callable[[str, bool], Sent]:
    """One chat request of the workload (a fresh connection each), plain or streamed with its usage; onelane's
    streamed texts and plain job ids are kept, to compare its answers with speculation on and off."""

    def send(prompt: str, streamed: bool) -> Sent:
        request = {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            **side.extra,
        }
        if not streamed:
            o = post_chat(side.url, {**request, "stream": False}, REQUEST_TIMEOUT_S)
            if side.onelane and o.ok and o.job_id:
                side.jobs[prompt] = o.job_id
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
        s = stream_once(
            side.url, {**request, "stream": True, "stream_options": {"include_usage": True}}, REQUEST_TIMEOUT_S
        )
        if side.onelane:
            side.answers[prompt] = s.text if s.error is None else None
        usage = s.usage or {}
        tokens = int(usage.get("completion_tokens", s.content_chunks))
        return Sent(
            True, s.error is None, failure_kind(s.error), s.total, s.ttft, tokens, int(usage.get("prompt_tokens", 0))
        )

    return send


def metrics(url: str) -> dict[str, float]:
    """The counters of METRICS from onelane's /metrics, each summed over its labels."""
    text = requests.get(f"{url}/metrics", timeout=30).text
    got = dict.fromkeys(METRICS, 0.0)
    for line in text.splitlines():
        match = re.match(r"^([a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if match:
            for key, name in METRICS.items():
                if match.group(1) == name:
                    got[key] += float(match.group(3))
    return got


def job_records(side: Side) -> dict[str, dict[str, Any]]:
    """Each plain request's job, read back through GET /v1/jobs/{id}, by prompt (once, at the end)."""
    records = {}
    for prompt, job_id in side.jobs.items():
        reply = requests.get(f"{side.url}/v1/jobs/{job_id}", timeout=30)
        if reply.status_code == 200:
            records[prompt] = reply.json()
            side.answers[prompt] = records[prompt].get("output")
    return records


@contextlib.contextmanager
def onelane_pair(settings: Settings, name: str, log: str, **extra: str) -> Iterator[Side]:
    """An `onelane worker` + `onelane web` pair on `settings`' Redis, as a Side (warm: two short requests)."""
    folder = Path(settings.var_dir)
    logs = (folder / f"{log}.worker.log", folder / f"{log}.web.log")
    store = Store.connect(settings)
    try:
        with onelane_stack(settings, logs=logs, **queue_bounds(1000), **extra) as stack:
            side = Side(name, stack.url, {"model": settings.model_name}, lambda: settle_queue(store), store)
            side.blas = loaded_blas(sorted(group_members(stack.worker.pid)))
            warm_up(side)
            yield side
            if not stack.alive:
                print(f"  ! {name}: a process exited during the run (see {logs[0]}, {logs[1]})")
    finally:
        store.redis.close()


def warm_up(side: Side) -> None:
    """Two short requests: the first batches pay for first-time allocations, not in a level."""
    for n in range(2):
        request = {"messages": [{"role": "user", "content": f"Say hello ({n})."}], "max_tokens": 8, "temperature": 0.0}
        warm = post_chat(side.url, {**request, **side.extra}, START_S)
        if not warm.ok:
            raise RuntimeError(f"{side.name}: warm-up request failed: {warm.error}")


@contextlib.contextmanager
def servers(settings: Settings, blas: str) -> Iterator[list[Side]]:
    """The three servers up, on the same model folder (see the module's docstring); all stopped on exit."""
    spec = Settings.model_fields
    on_env = {
        "ONELANE_SPECULATE": str(spec["speculate"].default),
        "ONELANE_SPECULATE_BUDGET": str(spec["speculate_budget"].default),
    }
    folder = Path(settings.var_dir)
    with contextlib.ExitStack() as up:
        peer: Server = up.enter_context(mlx_server(settings.model_path, folder / "mlx-server.log", blas=blas))
        mlx = Side(PEER if blas == "stock" else f"{PEER}+shim", peer.url, {}, lambda: settle(peer))
        mlx.blas = loaded_blas([peer.process.pid])
        on = up.enter_context(onelane_pair(settings, ON, "on", **on_env))
        off_folder, off_url = up.enter_context(private_redis())
        off_settings = Settings(redis_url=off_url, model=settings.model_path, var_dir=off_folder)  # type: ignore[arg-type]
        off = up.enter_context(onelane_pair(off_settings, OFF, "off", ONELANE_SPECULATE="0"))
        yield [on, off, mlx]
        for side, logs in ((on, folder), (off, off_folder)):
            for log in sorted(logs.glob("*.log")):
                if side is on and log.name.startswith("mlx"):
                    continue
                problems = matching_lines(log, LOG_NEEDLES)
                if problems:
                    print(f"  ! {side.name}: {len(problems)} error lines in {log.name}, first: {problems[0][:300]}")


# --- measuring -----------------------------------------------------------------------------------------------


def run_level(side: Side, workload: str, clients: int, r: int, args: argparse.Namespace) -> None:
    """One level of one round on one server: every client at once, each sending its requests back to back."""
    ask = workload_prompts(workload, clients, r, args.requests)
    at = streamed_at(args.requests - args.streamed, args.streamed)
    before = metrics(side.url) if side.onelane else None
    level = http_level(side.name, ask, at, sender(side, args.max_tokens))
    if not side.settle():
        side.unsettled.append((workload, clients, r))
    side.levels.setdefault((workload, clients), []).append(level)
    if before is not None:
        time.sleep(LEASE_WAIT_S)  # its worker adds its batch steps to /metrics once a lease period
        after = metrics(side.url)
        side.counts.setdefault((workload, clients), []).append({k: after[k] - before[k] for k in METRICS})
    print(f"  {level_line(side, workload, clients, level)}", flush=True)


def measure(sides: list[Side], args: argparse.Namespace) -> list[str]:
    """Every round, workload and level on every side, the order rotating; returns the levels skipped for time."""
    skipped = []
    ends = time.monotonic() + args.budget_s
    n = 0
    for r in range(args.rounds):
        print(f"-- round {r + 1}", flush=True)
        for workload in args.workloads:
            for clients in args.levels:
                for side in rotated(sides, r + n):
                    if time.monotonic() > ends:
                        skipped.append(f"{side.name} {workload} c={clients} round {r + 1}")
                        continue
                    run_level(side, workload, clients, r, args)
                n += 1
    return skipped


# --- printing ------------------------------------------------------------------------------------------------


def acceptance(c: dict[str, float]) -> float | None:
    return c["accepted"] / c["proposed"] if c["proposed"] else None


def seq_per_step(c: dict[str, float]) -> float | None:
    """A sequence's tokens per step: every step gives it one token plus the proposals it kept."""
    steps = c["generated"] - c["accepted"]
    return c["generated"] / steps if steps > 0 else None


def decode_rate(level: MixLevel) -> float | None:
    """The median over the level's streamed answers of their decode rate: tokens after the first over the time
    after the first (what a reader sees once the answer has started, its prompt read)."""
    rates = [
        (s.completion_tokens - 1) / (s.latency - s.ttft)
        for s in level.ok
        if s.streamed and s.ttft is not None and s.completion_tokens > 1 and s.latency > s.ttft
    ]
    return statistics.median(rates) if rates else None


def batch_per_step(c: dict[str, float]) -> float | None:
    return c["generated"] / c["steps"] if c["steps"] else None


def level_line(side: Side, workload: str, clients: int, level: MixLevel) -> str:
    failed = len(level.sent) - len(level.ok)
    tps = "-" if level.tps is None else f"{level.tps:.1f}"
    line = (
        f"{side.name:<20} {workload:<5} c={clients:<2} {tps:>7} tok/s over {level.wall_s:6.1f} s, TTFT p50 "
        f"{ms(level.ttft(50)):>6} ms, {len(level.ok)} ok, {failed} failed"
        + (f" ({dict(level.failures)})" if failed else "")
    )
    return line


def counts_line(side: Side, key: tuple[str, int]) -> str:
    each = side.counts.get(key, [])
    accepted = [a for c in each if (a := acceptance(c)) is not None]
    return (
        f"proposed {span([c['proposed'] for c in each])}, accepted {span([c['accepted'] for c in each])} "
        f"({span([a * 100 for a in accepted])} %), generated {span([c['generated'] for c in each])} in "
        f"{span([c['steps'] for c in each])} batch steps; prompts read in "
        f"{span([c['prefill_s'] / max(c['prefill_s'] + c['decode_s'], 1e-9) * 100 for c in each])} % of its step time"
    )


TABLE = (
    "workload",
    "c",
    "tok/s on",
    "tok/s off",
    "tok/s mlx",
    "on/off",
    "on/mlx",
    "TTFT p50 ms on | off | mlx",
    "decode tok/s on | off | mlx",
    "on/off",
    "on/mlx",
    "accepted %",
    "seq tok/step",
    "batch tok/step on | off",
)


def table(sides: list[Side], args: argparse.Namespace) -> list[str]:
    """Per workload x level: medians over the rounds (min-max), ratios round by round as median (min-max)."""
    on, off, mlx = sides
    tps = lambda lv: lv.tps  # noqa: E731
    ttft = lambda lv: lv.ttft(50)  # noqa: E731
    rows = []
    for workload in args.workloads:
        for c in args.levels:
            key = (workload, c)
            a, b, p = (s.levels.get(key, []) for s in sides)

            def ttfts(levels: list[MixLevel]) -> str:
                return span([v * 1000 for v in Row.each(levels, ttft)])

            rows.append(
                [
                    workload,
                    str(c),
                    span(Row.each(a, tps), "{:.1f}"),
                    span(Row.each(b, tps), "{:.1f}"),
                    span(Row.each(p, tps), "{:.1f}"),
                    span(Row.ratios(a, b, tps), "{:.2f}") + "x",
                    span(Row.ratios(a, p, tps), "{:.2f}") + "x",
                    f"{ttfts(a)} | {ttfts(b)} | {ttfts(p)}",
                    " | ".join(span(Row.each(levels, decode_rate), "{:.1f}") for levels in (a, b, p)),
                    span(Row.ratios(a, b, decode_rate), "{:.2f}") + "x",
                    span(Row.ratios(a, p, decode_rate), "{:.2f}") + "x",
                    span([x * 100 for cc in on.counts.get(key, []) if (x := acceptance(cc)) is not None], "{:.0f}"),
                    span([x for cc in on.counts.get(key, []) if (x := seq_per_step(cc)) is not None], "{:.2f}"),
                    " | ".join(
                        span([x for cc in s.counts.get(key, []) if (x := batch_per_step(cc)) is not None], "{:.2f}")
                        for s in (on, off)
                    ),
                ]
            )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(TABLE)] if rows else [len(h) for h in TABLE]

    def line(cells: list[str]) -> str:
        return "  ".join(cell.rjust(w) if i > 1 else cell.ljust(w) for i, (cell, w) in enumerate(zip(cells, widths)))

    return [line(list(TABLE)), line(["-" * w for w in widths]), *map(line, rows)]


def compare_answers(on: Side, off: Side) -> tuple[int, list[str]]:
    """Every prompt both onelane pairs answered: how many were compared, and those whose texts differ."""
    both = [p for p in on.answers if p in off.answers and on.answers[p] is not None and off.answers[p] is not None]
    return len(both), [p for p in both if on.answers[p] != off.answers[p]]


def first_difference(a: str, b: str) -> str:
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"at char {at}: on {a[max(0, at - 30) : at + 30]!r} vs off {b[max(0, at - 30) : at + 30]!r}"


def peers_lines(args: argparse.Namespace) -> list[str]:
    """What else could have been measured, and why it was not."""
    missing = [module for module in ("vllm_mlx", "rapid_mlx") if not importlib.util.find_spec(module)]
    draft = (
        "mlx_lm.server --draft-model: no such peer: no draft model of SmolLM2's tokenizer smaller than the target "
        "exists offline (the only model with it here is SmolLM2-135M-Instruct, the target itself)"
        if args.model == "smollm2"
        else f"mlx_lm.server --draft-model: no such peer: no draft model for {args.model} offline"
    )
    return [
        draft,
        "vllm-mlx, Rapid-MLX: "
        + (
            f"not measured: not installed here (importlib.util.find_spec finds no {', '.join(missing)}), and not "
            "installable (no wheels for this platform offline)"
            if missing
            else "installed, but not driven by this benchmark"
        ),
    ]


def report(sides: list[Side], args: argparse.Namespace, load: float, skipped: list[str], wall: float) -> None:
    on, off, mlx = sides
    records = job_records(on), job_records(off)
    print()
    print(
        f"speculation: model {args.model}, workloads {','.join(args.workloads)}, levels {args.levels}, {args.rounds} "
        f"rounds, each client {args.requests} requests back to back (requests "
        f"{sorted(n + 1 for n in streamed_at(args.requests - args.streamed, args.streamed))} streamed), max_tokens {args.max_tokens}, temperature 0, natural stops; {os.cpu_count()} CPUs, load average "
        f"{load:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    spec = Settings.model_fields
    print(
        f"{ON}: ONELANE_SPECULATE={spec['speculate'].default}, ONELANE_SPECULATE_BUDGET="
        f"{spec['speculate_budget'].default} (defaults); {OFF}: ONELANE_SPECULATE=0, a second worker+web pair on its "
        f"own Redis, up at the same time; {mlx.name}: --decode-concurrency 32 (its default)"
    )
    for side in sides:
        print(f"  BLAS of {side.name}: {side.blas}")
    print("\n".join(peers_lines(args)))
    print("\nspeculation's counts per level (/metrics deltas, median (min-max) over the rounds):")
    for workload in args.workloads:
        for c in args.levels:
            print(f"  {workload:<5} c={c:<2} {ON}: {counts_line(on, (workload, c))}")
            print(f"  {'':<5} {'':<4} {OFF}: {counts_line(off, (workload, c))}")
    print(
        "\nper workload x level, medians over the rounds (min-max); on/off and on/mlx: tokens/s ratios round by round; "
        "accepted %: accepted/proposed; seq tok/step: generated/(generated-accepted); batch tok/step: generated over "
        "onelane_batch_steps_total's delta (which counts prefill steps too: off can fall below 1)"
    )
    print("\n".join(table(sides, args)))
    jobs = [j for j in records[0].values() if j.get("timings")]
    job_prop = sum(int(j["timings"].get("proposed_tokens", 0)) for j in jobs)
    job_acc = sum(int(j["timings"].get("accepted_tokens", 0)) for j in jobs)
    print(
        f"\n{ON}'s plain jobs read back (GET /v1/jobs/{{id}}): {len(jobs)}, timings.proposed_tokens {job_prop}, "
        f"accepted_tokens {job_acc}" + (f" ({100 * job_acc / job_prop:.0f} %)" if job_prop else "")
    )
    compared, mismatched = compare_answers(on, off)
    print(
        f"answers, {ON} vs {OFF} (greedy: must be equal): {compared} prompts compared, {len(mismatched)} mismatches"
        + (
            ""
            if compared == len(on.answers)
            else f" ({len(on.answers) - compared} of {ON}'s not compared: no answer on one side)"
        )
    )
    for prompt in mismatched[:3]:
        print(f"  ! {prompt.splitlines()[0]} {first_difference(on.answers[prompt] or '', off.answers[prompt] or '')}")
    for side in sides:
        for workload, c, r in side.unsettled:
            print(f"  ! {side.name}: still busy after {workload} c={c} round {r + 1}")
    if skipped:
        print(f"skipped for --budget-s: {len(skipped)} levels, first: {skipped[0]}")
    print(f"total {time.monotonic() - wall:.1f} s")


# --- main ----------------------------------------------------------------------------------------------------


def main() -> None:
    args = parse_args()
    wall, load = time.monotonic(), os.getloadavg()[0]
    with bench_env(model=args.model) as settings, servers(settings, args.peer_blas) as sides:
        skipped = measure(sides, args)
        report(sides, args, load, skipped, wall)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (the default model, as float32), demo, or a folder")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrent clients, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"of {','.join(WORKLOADS)}")
    parser.add_argument("--requests", type=int, default=REQUESTS, help="per client per level (>= 2)")
    parser.add_argument(
        "--streamed", type=int, default=None, help="of them streamed (their TTFT and decode rate; default: all but one)"
    )
    parser.add_argument("--peer-blas", default="shim", choices=BLAS_CHOICES, help="mlx_lm.server's BLAS")
    parser.add_argument("--budget-s", type=float, default=4 * 3600.0, help="no level starts after this many seconds")
    args = parser.parse_args()
    args.levels = [int(c) for c in args.levels.split(",")]
    args.workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown or args.requests < 2:
        parser.error(f"unknown workloads {sorted(unknown)}" if unknown else "--requests must be at least 2")
    args.streamed = args.requests - 1 if args.streamed is None else args.streamed
    if not 1 <= args.streamed < args.requests:
        parser.error("--streamed must be at least 1 and leave one request plain")
    return args


if __name__ == "__main__":
    main()
