"""Structured output on real-world JSON schemas: which ones onelane accepts, and whether every answer it completes
under one is valid against it.

    ./dev.sh bench schema_coverage [--model smollm2|demo|PATH] [--concurrency 16] [--max-tokens 256] [--limit N]

The corpus is bench/schemas/corpus.jsonl (a few hundred schemas from the JSON-Schema-Test-Suite, SchemaStore and
JSONSchemaBench; bench/schemas/README.md says which, their licenses and the commits taken). One stack (`onelane
worker` + `onelane web`, a private Redis) on the default model. For each schema, one streamed chat completion with
`response_format` `json_schema` (`strict`), greedy, asking for a JSON instance of it (its title and description,
if any, in the prompt), --concurrency at a time. Streamed, so that the headers of the 200 mark its admission.
Each schema ends as one of:
- refused: a 400 at admission, grouped by the reason its message names (the unimplemented keyword, ...);
- valid: finish_reason `stop`, and the answer is valid against the schema (the `jsonschema` package, the schema's
  own dialect, formats not asserted);
- INVALID: finish_reason `stop`, but the answer is not JSON or not valid. A bug: printed in full, exit status 1;
- length: cut at --max-tokens;
- failed: anything else (another status, an error in the stream, a time-out, a schema `jsonschema` cannot use).
Admission latency is from sending to the 400, or to the 200's headers. Answers with an object that has a key twice
are listed too (JSON allows it; parsers disagree on which value wins). The worker reads its settings from the
environment, e.g. `ONELANE_FAST_FORWARD=0 ./dev.sh bench schema_coverage` runs with fast-forward off.

Every figure printed is measured in this run; every process started here is stopped before the script returns.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import warnings
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import best_match

from bench.harness import add_model_option, bench_env, onelane_stack
from bench.report import pct

CORPUS = Path(__file__).parent / "schemas" / "corpus.jsonl"
READ_TIMEOUT_S = 600.0  # the longest silence of a stream (its pings come every few seconds)
VERDICTS = ("valid", "INVALID", "length", "failed")
WARM_UP = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@dataclass(frozen=True)
class Entry:
    """One schema of the corpus."""

    source: str
    name: str
    schema: dict[str, Any]


@dataclass(frozen=True)
class Outcome:
    """How one schema's request ended: refused (with its reason) or a verdict, the answer, and the timings."""

    entry: Entry
    verdict: str  # "refused" or one of VERDICTS
    detail: str = ""  # the refusal's reason, why an answer is invalid, or what failed
    output: str = ""
    admission_s: float | None = None
    total_s: float = 0.0
    tokens: int = 0
    twice: bool = False  # the answer has an object with a key twice (valid JSON; parsers disagree on which wins)


def load(limit: int | None) -> list[Entry]:
    lines = CORPUS.read_text().splitlines()[:limit]
    return [Entry(**json.loads(line)) for line in lines]


def ask(entry: Entry) -> str:
    """The prompt: a JSON instance of the schema, told by its title and description when it has them."""
    about = [f"{k}: {entry.schema[k][:300]}" for k in ("title", "description") if isinstance(entry.schema.get(k), str)]
    return "\n".join(
        ["Write one example JSON instance of the following JSON schema.", *about, "Answer with JSON only."]
    )


def body(entry: Entry, model: str, max_tokens: int) -> dict[str, Any]:
    name = re.sub(r"[^A-Za-z0-9_-]", "_", entry.name)[:64]
    return {
        "model": model,
        "messages": [{"role": "user", "content": ask(entry)}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": name, "schema": entry.schema, "strict": True},
        },
    }


def send(url: str, entry: Entry, model: str, max_tokens: int) -> Outcome:
    """One schema's request, start to end; never raises."""
    started = time.monotonic()
    try:
        reply = requests.post(
            f"{url}/v1/chat/completions", json=body(entry, model, max_tokens), stream=True, timeout=(10, READ_TIMEOUT_S)
        )
    except requests.RequestException as exc:
        return Outcome(entry, "failed", f"request: {exc!r}", total_s=time.monotonic() - started)
    admitted = time.monotonic() - started
    with reply:
        if reply.status_code == 400:
            return Outcome(entry, "refused", reason(reply), admission_s=admitted, total_s=admitted)
        if reply.status_code != 200:
            return Outcome(entry, "failed", f"http {reply.status_code}: {reply.text[:300]}", total_s=admitted)
        try:
            text, finish, tokens, error = read_stream(reply)
        except (requests.RequestException, ValueError) as exc:
            return Outcome(entry, "failed", f"stream: {exc!r}", admission_s=admitted)
    total = time.monotonic() - started
    done = {"output": text, "admission_s": admitted, "total_s": total, "tokens": tokens}
    if error or finish not in ("stop", "length"):
        return Outcome(entry, "failed", error or f"finish_reason {finish}", **done)
    if finish == "length":
        return Outcome(entry, "length", **done)
    try:
        why, twice = invalidity(entry.schema, text)
    except Exception as exc:  # the validator's own failure, reported, not a verdict
        return Outcome(entry, "failed", f"jsonschema cannot check it: {type(exc).__name__}: {exc}"[:300], **done)
    return Outcome(entry, "INVALID" if why else "valid", why or "", twice=twice, **done)


def read_stream(reply: requests.Response) -> tuple[str, str | None, int, str | None]:
    """An OpenAI stream's (text, finish_reason, completion tokens, error message)."""
    text: list[str] = []
    finish: str | None = None
    tokens, error = 0, None
    for raw in reply.iter_lines():
        line = raw.decode()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: ") :])
        if "error" in chunk:
            error = str(chunk["error"].get("message"))
        for choice in chunk.get("choices") or []:
            text.append(choice.get("delta", {}).get("content") or "")
            finish = choice.get("finish_reason") or finish
        tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
    return "".join(text), finish, tokens, error


def reason(reply: requests.Response) -> str:
    """A 400's message, cut to what names the reason (so that refusals group): `Unimplemented keys: ["if"]`, ..."""
    try:
        message = str(reply.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"(no error message) {reply.text[:100]}"
    lines = message.removeprefix("the schema is not supported: ").splitlines()
    message = lines[0] + (lines[-1].removeprefix("error:") if len(lines) > 1 else "")  # (a regex's error comes last)
    message = re.sub(r"regexes /.*/ and /.*/ are", "regexes /…/ and /…/ are", message)
    message = re.sub(r"(references with sibling keys are not supported): .*", r"\1", message)
    return message.split(". ")[0][:120]


def invalidity(schema: dict[str, Any], text: str) -> tuple[str | None, bool]:
    """(None if `text` is JSON valid against `schema` (its own dialect, 2020-12 if it names none), else why not;
    whether one of its objects has a key twice)."""
    twice: list[bool] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        twice.append(len({k for k, _ in items}) < len(items))
        return dict(items)

    try:
        instance = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        return f"not JSON: {exc}", False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (an unknown $schema falls back to 2020-12, with a warning)
        validator = validators.validator_for(schema, default=Draft202012Validator)(schema)
        error = best_match(validator.iter_errors(instance))
    return (None if error is None else f"{error.message} (at {error.json_path})"), any(twice)


def run_all(url: str, entries: list[Entry], model: str, max_tokens: int, concurrency: int) -> list[Outcome]:
    """Every entry's request, `concurrency` at a time, a progress line every 25 ended."""
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for outcome in pool.map(lambda e: send(url, e, model, max_tokens), entries):
            outcomes.append(outcome)
            if len(outcomes) % 25 == 0:
                print(f"  {len(outcomes)}/{len(entries)} ended", flush=True)
    return outcomes


# --- the report ---------------------------------------------------------------------------------------------------


def table(outcomes: list[Outcome]) -> None:
    by_source: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by_source[o.entry.source].append(o)
    head = ["source", "schemas", "refused", "accepted", *VERDICTS, "valid/accepted"]
    print(f"{head[0]:<20}" + "".join(f"{h:>10}" for h in head[1:-1]) + f"{head[-1]:>16}")
    for source, group in [*by_source.items(), ("overall", outcomes)]:
        counts = Counter(o.verdict for o in group)
        accepted = len(group) - counts["refused"]
        share = f"{counts['valid'] / accepted:.0%}" if accepted else "-"
        cells = [len(group), counts["refused"], accepted, *(counts[v] for v in VERDICTS)]
        print(f"{source:<20}" + "".join(f"{c:>10}" for c in cells) + f"{share:>16}")


def refusals(outcomes: list[Outcome]) -> None:
    refused = [o for o in outcomes if o.verdict == "refused"]
    print(f"\nrefusal reasons ({len(refused)} schemas):")
    for why, n in Counter(o.detail for o in refused).most_common():
        sources = Counter(o.entry.source for o in refused if o.detail == why)
        print(f"  {n:>4}  {why}   [" + ", ".join(f"{s} {k}" for s, k in sources.most_common()) + "]")


def latencies(outcomes: list[Outcome], wall_s: float) -> None:
    print("\nadmission latency (sent -> the 400, or -> the 200's headers):")
    for label, verdicts in (("refused (400)", ("refused",)), ("admitted (200)", VERDICTS)):
        times = [o.admission_s for o in outcomes if o.verdict in verdicts and o.admission_s is not None]
        if times:
            print(
                f"  {label:<15} p50 {pct(times, 50) * 1000:.1f} ms, p99 {pct(times, 99) * 1000:.1f} ms (n={len(times)})"
            )
    answered = [o for o in outcomes if o.verdict in VERDICTS and o.tokens]
    if answered:
        tokens = sum(o.tokens for o in answered)
        totals = [o.total_s for o in answered]
        print(
            f"answers: {tokens} tokens in {wall_s:.0f} s ({tokens / wall_s:.1f} tokens/s over the run), "
            f"latency p50 {pct(totals, 50):.1f} s, p99 {pct(totals, 99):.1f} s"
        )


def problems(outcomes: list[Outcome]) -> int:
    """Print every failure, and every invalid answer in full with its schema; returns how many were invalid."""
    for o in outcomes:
        if o.verdict == "failed":
            print(f"\nFAILED {o.entry.source} {o.entry.name}: {o.detail}")
    twice = [o for o in outcomes if o.twice]
    if twice:
        print(
            f"\nanswers with a key twice in one object ({len(twice)}; valid JSON, but parsers disagree on which wins):"
        )
        for o in twice:
            print(f"  {o.verdict} {o.entry.source} {o.entry.name}: {o.output[:160]!r}")
    invalid = [o for o in outcomes if o.verdict == "INVALID"]
    for o in invalid:
        print(f"\nINVALID {o.entry.source} {o.entry.name}: {o.detail}")
        print(f"  schema: {json.dumps(o.entry.schema)}")
        print(f"  output: {o.output!r}")
    return len(invalid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_option(parser)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--limit", type=int, default=None, help="only the first N schemas of the corpus")
    args = parser.parse_args()
    entries = load(args.limit)
    with bench_env(model=args.model) as settings:
        folder = settings.var_dir
        print(
            f"{len(entries)} schemas from {CORPUS.name}; model {settings.model_path}; concurrency "
            f"{args.concurrency}; max_tokens {args.max_tokens}; load average {os.getloadavg()[0]:.2f}; "
            f"logs in {folder}",
            flush=True,
        )
        with onelane_stack(settings, quiet=True) as stack:
            url = stack.url
            warm = send(url, Entry("warm-up", "warm-up", WARM_UP), settings.model_name, 16)
            print(f"warm-up: {warm.verdict} {warm.detail}", flush=True)
            started = time.monotonic()
            outcomes = run_all(url, entries, settings.model_name, args.max_tokens, args.concurrency)
            wall_s = time.monotonic() - started
    print()
    table(outcomes)
    refusals(outcomes)
    latencies(outcomes, wall_s)
    if problems(outcomes):
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
