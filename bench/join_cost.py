"""What a sequence joining a decoding batch costs: mlx-lm's BatchGenerator (as mlx_lm.server runs it) against the
worker's engine (worker/batch/forward.py), on the same model, prompts and batch, alternating run by run.

    ./dev.sh bench join_cost [--model smollm2|demo|PATH] [--batches 1,8] [--joins 1,2] [--runs 5]

A run: `batch` sequences decode (ignore_eos) until steady, then `joins` newcomers of 50-token prompts are inserted
at once; the steps after that are timed until every newcomer has made its first token. Printed per case, medians
over --runs with min and max: a steady decode step, the extra time the join cost (the steps until the newcomers'
first token, less as many steady steps), and the newcomers' first token after their insert. The batch generator
reads a newcomer's last prompt token in a forward pass of its own before it joins the decode step; the engine reads
it as a row of the next decode step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.harness import model_folder, rotated
from bench.report import span
from tasks.job import SamplingParams
from worker.blas import preload_openblas

PROMPT_TOKENS = 50
WARM_STEPS = 6


def prompt(n: int) -> list[int]:
    """A made-up prompt of PROMPT_TOKENS ordinary token ids, its own for each n."""
    return [(n * 37 + j * 11) % 4000 + 100 for j in range(PROMPT_TOKENS)]


class Side:
    """One way of batching: insert sequences, step, and tell which uids made a token."""

    def __init__(self, name: str, insert: Callable[[list[list[int]]], list[int]], step: Callable[[], set[int]]):
        self.name, self.insert, self.step = name, insert, step


def mlx_side(model) -> Side:  # type: ignore[no-untyped-def]
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, completion_batch_size=64, prefill_batch_size=8, prefill_step_size=2048)

    def step() -> set[int]:
        return {int(r.uid) for r in gen.next()[1]}

    return Side(
        "mlx-lm BatchGenerator", lambda ps: [int(u) for u in gen.insert(ps, max_tokens=[10_000] * len(ps))], step
    )


def engine_side(engine) -> Side:  # type: ignore[no-untyped-def]
    engine.reset()
    params = SamplingParams(max_tokens=10_000, temperature=0, ignore_eos=True)
    return Side(
        "onelane engine", lambda ps: [engine.insert(p, params) for p in ps], lambda: {t.uid for t in engine.step()}
    )


def run(side: Side, batch: int, joins: int) -> tuple[float, float, float]:
    """(a steady step, the join's extra time, the newcomers' first token after their insert), in seconds."""
    side.insert([prompt(n) for n in range(batch)])
    steady = []
    for _ in range(batch + WARM_STEPS):
        started = time.perf_counter()
        side.step()
        steady.append(time.perf_counter() - started)
    step_s = statistics.median(steady[-WARM_STEPS:])
    new = set(side.insert([prompt(1000 + n) for n in range(joins)]))
    started, steps, seen = time.perf_counter(), 0, set()
    while not new <= seen:
        seen |= side.step() & new
        steps += 1
    took = time.perf_counter() - started
    return step_s, took - steps * step_s, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2 (the default model), demo, or a folder")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--joins", default="1,2")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    preload_openblas()
    from worker.batch.engine import Engine

    with tempfile.TemporaryDirectory(prefix="onelane-model-") as tmp:
        engine = Engine.load(str(model_folder(args.model, Path(tmp))), max_batch=64, prefill_step=2048)
    print(
        f"join cost, model {args.model}, prompts of {PROMPT_TOKENS} tokens, {args.runs} runs alternating; median (min-max)"
    )
    print("| batch | joining | side | decode step ms | join's extra ms | newcomers' first token ms |")
    print("|---|---|---|---|---|---|")
    for batch in map(int, args.batches.split(",")):
        for joins in map(int, args.joins.split(",")):
            figures: dict[str, list[tuple[float, float, float]]] = {}
            for r in range(args.runs):
                makers = [lambda: mlx_side(engine.model), lambda: engine_side(engine)]
                for make in rotated(makers, r):
                    side = make()
                    figures.setdefault(side.name, []).append(run(side, batch, joins))
            for name, rows in figures.items():
                cells = [span([row[k] * 1000 for row in rows]) for k in range(3)]
                print(f"| {batch} | {joins} | {name} | " + " | ".join(cells) + " |")
        engine.reset()


if __name__ == "__main__":
    main()
