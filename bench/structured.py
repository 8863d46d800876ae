"""What constrained decoding costs, on the default model, through the real worker (in this process, on OpenBLAS).

    ./dev.sh bench structured [--model smollm2|demo|PATH] [--rounds 3] [--jobs 32] [--tokens 96]

1. Throughput: `--jobs` chat jobs admitted at once, each generating `--tokens` tokens, constrained (a JSON schema
   of a long list that cannot complete within them) against free ones (ignore_eos, the same prompts and length),
   and mixed (one constrained among free ones: what the free ones pay for sharing the batch), in alternating
   rounds. Printed: tokens/s of each, and the ratios to free per round (median and spread).
2. The mask: its time per masked token and per step of the constrained rounds (llguidance computing the mask, and
   MLX applying it), from the worker's own counters.
3. Compiling: a grammar checked at admission (no tokenizer), compiled against the model's tokenizer cold, and
   served from the compiled cache (a copy), for four schemas.
4. Fast-forward: a schema of long fixed keys answered greedily alone, with ONELANE_FAST_FORWARD off and on, in
   alternating runs: seconds per answer, steps per answer, and whether the answers are the same.
Every figure is measured in this run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Iterator
from typing import Any

from bench.harness import InProcess, add_model_option, bench_env, prompt, rotated
from bench.report import spread
from tasks.job import JobSpec, Message, SamplingParams
from tasks.structured import Constraint, Tool, json_constraint, tools_constraint
from worker.blas import preload_openblas

LONG_LIST = {
    "type": "object",
    "properties": {"things": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 200}},
    "required": ["things"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "the_customer_full_legal_name": {"type": "string", "maxLength": 24},
        "the_customer_primary_email_address": {"type": "string", "maxLength": 24},
        "the_shipping_address_of_the_order": {"type": "string", "maxLength": 32},
        "the_number_of_items_in_the_order": {"type": "integer", "minimum": 1, "maximum": 99},
        "the_order_is_a_gift_for_someone_else": {"type": "boolean"},
    },
    "required": [
        "the_customer_full_legal_name",
        "the_customer_primary_email_address",
        "the_shipping_address_of_the_order",
        "the_number_of_items_in_the_order",
        "the_order_is_a_gift_for_someone_else",
    ],
    "additionalProperties": False,
}
PERSON = {  # what the SDK's parse() sends for a small pydantic model
    "$defs": {"Pet": {"properties": {"kind": {"enum": ["cat", "dog"], "type": "string"}}, "required": ["kind"]}},
    "properties": {
        "name": {"title": "Name", "type": "string"},
        "age": {"title": "Age", "type": "integer"},
        "pets": {"items": {"$ref": "#/$defs/Pet"}, "type": "array"},
    },
    "required": ["name", "age", "pets"],
    "title": "Person",
    "type": "object",
    "additionalProperties": False,
}
WEATHER = Tool(
    name="get_weather",
    description="The weather now",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
    },
)


class Bench(InProcess):
    def admit(self, text: str, constraint: Constraint | None, **params: Any) -> str:
        spec = JobSpec(
            owner=f"u{len(text) % 7}",
            model=self.settings.model_name,
            messages=(Message(role="user", content=text),),
            params=SamplingParams(**params),
            constraint=constraint,
        )
        return self.submit(spec)

    def run(self, asks: list[tuple[str, Constraint | None, dict[str, Any]]]) -> tuple[float, list[Any]]:
        """The jobs admitted at once: (seconds from the first admission to the last end, the jobs as they ended)."""
        return self.ended([self.admit(text, constraint, **params) for text, constraint, params in asks])


def throughput(b: Bench, rounds: int, n: int, tokens: int) -> None:
    print(f"\n== {n} jobs at once, {tokens} tokens each: constrained (JSON schema) against free (ignore_eos)")
    constraint = json_constraint(LONG_LIST, "response_format")
    texts = [f"List {prompt(k, 6)} as JSON." for k in range(n)]
    rates: dict[str, list[float]] = {"constrained": [], "free": [], "mixed": []}
    kinds = ("constrained", "free", "mixed")
    masks = mask_s = steps = 0.0
    with b.worker():
        # warm up: a full batch of each kind first (the first batch of a size pays for its memory)
        for kind in (constraint, None):
            b.run([(t, kind, {"max_tokens": 8, "ignore_eos": True}) for t in texts])
        for r in range(rounds):
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                times, counters = b.engine.grammars.times, b.engine.counters
                before = (times.masks, times.mask_s, counters.steps)
                constrained = {"constrained": n, "free": 0, "mixed": 1}[kind]  # mixed: one among free ones
                asks = [
                    (t, constraint if k < constrained else None, {"max_tokens": tokens, "ignore_eos": True})
                    for k, t in enumerate(texts)
                ]
                wall, jobs = b.run(asks)
                made = sum(j.usage.completion_tokens for j in jobs)
                assert all(j.finish_reason == "length" for j in jobs), [j.finish_reason for j in jobs]
                rates[kind].append(made / wall)
                for j in jobs[:constrained]:
                    _check_prefix(j.output)
                if kind == "constrained":
                    masks += times.masks - before[0]
                    mask_s += times.mask_s - before[1]
                    steps += b.engine.counters.steps - before[2]
                print(f"  round {r + 1} {kind:>11}: {made} tokens in {wall:.2f} s = {made / wall:.1f} tok/s")
    for kind in ("constrained", "mixed"):
        ratios = [c / f for c, f in zip(rates[kind], rates["free"])]
        each = ", ".join(f"{x:.3f}" for x in ratios)
        print(f"  {kind} / free: median {statistics.median(ratios):.3f}x (rounds: {each})")
    for kind in kinds:
        print(f"  tok/s {kind}: {spread(rates[kind], '{:.1f}')}")
    print(
        f"\n== the mask: {masks:.0f} masks over {steps:.0f} steps; {mask_s / masks * 1e3:.3f} ms per masked token, "
        f"{mask_s / steps * 1e3:.2f} ms per step of {n} constrained jobs"
    )


def _check_prefix(text: str) -> None:
    """A constrained answer cut short is still a prefix of the schema's JSON: it opens as the schema says."""
    assert text.startswith('{"things":['), text[:80]


def compiling(b: Bench) -> None:
    from tasks.grammar_check import GrammarChecks
    from worker.grammar import Grammars

    print("\n== compiling: checked at admission (a checker process, no tokenizer; first and kept), compiled against")
    print("   the tokenizer cold, and cached")
    grammars = Grammars(b.engine.tokenizer, b.engine.eos)
    started = time.perf_counter()
    grammars.tokenizer  # noqa: B018 (built once per model)
    print(f"  the tokenizer, for llguidance, once per model: {(time.perf_counter() - started) * 1e3:.0f} ms")
    cases = {
        "long list": lambda: json_constraint(LONG_LIST, "p"),
        "order (long keys)": lambda: json_constraint(ORDER, "p"),
        "pydantic person": lambda: json_constraint(PERSON, "p"),
        "tool (required)": lambda: tools_constraint((WEATHER,), "required", True),
    }
    checks = GrammarChecks(checkers=1)
    checks.verdict("lark", 'start: "ok"')  # (the checker's start, once per web process: not a check's time)
    for name, make in cases.items():
        first, kept = [], []
        for _ in range(20):
            with _checked_by(checks):
                started = time.perf_counter()
                constraint = make()
                first.append(time.perf_counter() - started)
                started = time.perf_counter()
                make()
                kept.append(time.perf_counter() - started)
        started = time.perf_counter()
        grammars.matcher(constraint.grammar)
        cold = time.perf_counter() - started
        cached = []
        for _ in range(20):
            started = time.perf_counter()
            grammars.matcher(constraint.grammar)
            cached.append(time.perf_counter() - started)
        print(
            f"  {name:>18}: admission first {statistics.median(first) * 1e3:.2f} ms, kept "
            f"{statistics.median(kept) * 1e3:.3f} ms; cold compile {cold * 1e3:.2f} ms, cached "
            f"{statistics.median(cached) * 1e3:.3f} ms (medians of 20)"
        )
    checks.close()


@contextlib.contextmanager
def _checked_by(checks: Any) -> Iterator[None]:
    """Admission's checks made by `checks`, its kept verdicts forgotten: each first check goes to its checker."""
    import tasks.grammar_check as grammar_check

    checks._verdicts.clear()
    saved, grammar_check.CHECKS = grammar_check.CHECKS, checks
    try:
        yield
    finally:
        grammar_check.CHECKS = saved


def fast_forward(b: Bench, runs: int) -> None:
    print("\n== fast-forward: a schema of long fixed keys, greedy, alone; ONELANE_FAST_FORWARD off (0) and on (4)")
    constraint = json_constraint(ORDER, "response_format")
    text = "Write the order of Ann Lee, who bought three books for her brother, as JSON."
    seconds: dict[int, list[float]] = {0: [], 4: []}
    steps: dict[int, list[int]] = {0: [], 4: []}
    answers: dict[int, set[str]] = {0: set(), 4: set()}
    tokens: dict[int, set[int]] = {0: set(), 4: set()}
    for r in range(runs):
        for ff in rotated((0, 4), r):
            with b.worker(fast_forward=ff):
                b.run([(text, constraint, {"max_tokens": 8})])  # warm up
                before = b.engine.counters.steps
                wall, (job,) = b.run([(text, constraint, {"max_tokens": 160, "temperature": 0})])
                assert job.finish_reason == "stop", job.finish_reason
                json.loads(job.output)
                seconds[ff].append(wall)
                steps[ff].append(b.engine.counters.steps - before)
                answers[ff].add(job.output)
                tokens[ff].add(job.usage.completion_tokens)
    for ff in (0, 4):
        print(
            f"  fast_forward={ff}: {spread(seconds[ff], '{:.2f}')} s per answer, {statistics.median(steps[ff]):.0f} "
            f"steps, {sorted(tokens[ff])} tokens"
        )
    print(
        f"  on / off: {statistics.median(seconds[4]) / statistics.median(seconds[0]):.2f}x the time, "
        f"the same answer: {answers[0] == answers[4] and len(answers[0]) == 1}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_option(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--compiling-only", action="store_true", help="only the admission check and compile times")
    args = parser.parse_args()
    preload_openblas()
    overrides = {"max_batch": args.jobs, "max_queue": 1000, "max_queued_per_user": 1000}
    with bench_env(model=args.model, **overrides) as settings:  # type: ignore[arg-type]
        b = Bench(settings)
        print(f"model {args.model}; {args.jobs} jobs, {args.tokens} tokens; rounds {args.rounds}")
        compiling(b)
        if args.compiling_only:
            return
        fast_forward(b, args.rounds)
        throughput(b, args.rounds, args.jobs, args.tokens)


if __name__ == "__main__":
    main()
