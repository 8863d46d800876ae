"""Speculation at the batch's own level, no queue: where the answers of a closed loop of clients end at the same step.

    .venv/bin/python -m bench.speculation_lockstep [--workload edit|quote|json|chat] [--clients 8] [--requests 3]
                                                   [--max-tokens 128] [--vary 0,32] [--floor 4] [--rounds 2]
                                                   [--model smollm2|demo|PATH]

The worker's own batch (`Engine`, `ContinuousBatch`), OpenBLAS and onelane's shim preloaded as the worker has them,
runs `--clients` clients that each send `--requests` prompts of bench.speculation's `--workload` back to back: a
client's next prompt joins the batch in the step after its answer ends. Greedy, natural stops, `ONELANE_PREFILL_STEP`
(128) and the decode floor `--floor` (tokens/s, ONELANE_DECODE_FLOOR's default 4) as the worker has them.

Each answer's max_tokens is `--max-tokens` plus a seeded offset in -V..V for each V of `--vary` (0: every answer
the same length). With V = 0 and answers that run to their length (the edit and JSON rewrites at 128 do), every
client's answer ends at the same step without speculation, so its next prompts are read all together, in the
widest passes; speculation, which gives each sequence as many tokens a step as it keeps, ends them at different
steps, and their next prompts are read a few at a time beside the others' decoding. A real crowd of clients ends
at different steps either way: V = 32 shows that case.

Per V, for each of `--rounds` rounds, speculation off then on (the order alternating round by round): tokens/s over
the loop's wall time, batch steps, the batch's seconds reading prompts and drawing tokens (its Counters), tokens
proposed and kept, and the prompts' cost by how many tokens a step read of them (ms a prompt token: a forward pass
reads every weight whatever its width, so narrow prompt passes cost more a token). Then the medians and on/off
round by round. Every figure printed is measured in this run.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bench.harness import bench_env
from bench.report import spread
from bench.speculation import workload_prompts
from tasks.job import JobSpec
from tasks.settings import Settings
from worker.blas import preload_openblas

if TYPE_CHECKING:
    from worker.batch.engine import Engine

SIDES = ("off", "on")
BANDS = (64, 256, 768)  # prompt tokens a step read: up to 64, up to 256, up to 768, more


@dataclass
class Run:
    """One side's loop: what it made, in what time, and its prompt steps (tokens read, seconds) by band."""

    tokens: int = 0
    wall_s: float = 0.0
    steps: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    proposed: int = 0
    accepted: int = 0
    bands: dict[int, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0, 0.0]))

    @property
    def rate(self) -> float:
        return self.tokens / self.wall_s


def band(tokens: int) -> int:
    return next((b for b in BANDS if tokens <= b), 0)


def loop(engine: Engine, prompts: list[list[list[int]]], limits: list[list[int]], speculate: int, floor: float) -> Run:
    """Every client's prompts through one fresh batch, each client's next joining once its answer ended."""
    from mlx_lm.sample_utils import greedy_sampler

    from worker.batch.speculation import Speculation

    defaults = Settings.model_fields
    engine.configure(
        defaults["max_batch"].default,
        defaults["prefill_step"].default,
        floor,
        Speculation(speculate, defaults["speculate_budget"].default),
    )
    batch = engine._new_batch()
    eos = frozenset(engine.tokenizer.eos_token_ids)
    sent = [0] * len(prompts)
    owner: dict[int, int] = {}

    def send(c: int) -> None:
        owner[batch.insert(prompts[c][sent[c]], limits[c][sent[c]], greedy_sampler, stops=eos)] = c
        sent[c] += 1

    run = Run()
    began = time.perf_counter()
    for c in range(len(prompts)):
        send(c)
    while owner:
        before = batch.work.prefill_s
        for emitted in batch.step():
            run.tokens += 1
            if emitted.finish_reason is not None:
                c = owner.pop(emitted.uid)
                if sent[c] < len(prompts[c]):
                    send(c)
        if batch.padded_prefill:
            totals = run.bands[band(batch.padded_prefill)]
            totals[0] += 1
            totals[1] += batch.padded_prefill
            totals[2] += batch.work.prefill_s - before
    run.wall_s = time.perf_counter() - began
    work = batch.work
    run.steps, run.prefill_s, run.decode_s = work.steps, work.prefill_s, work.decode_s
    run.proposed, run.accepted = work.proposed_tokens, work.accepted_tokens
    return run


def line(side: str, run: Run) -> str:
    bands = ", ".join(
        f"{f'<={b}' if b else f'>{BANDS[-1]}'}: {int(n)} steps {int(t)} tok {1000 * s / t:.2f} ms/tok"
        for b, (n, t, s) in sorted(run.bands.items(), key=lambda kv: kv[0] or 10**9)
    )
    kept = f"{run.accepted}/{run.proposed} kept" if run.proposed else "none proposed"
    return (
        f"  {side:<3} {run.tokens} tokens in {run.wall_s:6.1f} s = {run.rate:5.1f} tok/s; {run.steps} steps; prompts "
        f"{run.prefill_s:5.1f} s, draws {run.decode_s:5.1f} s; {kept}; prompt steps by tokens read: {bands}"
    )


def main() -> None:
    args = parse_args()
    preload_openblas()  # (the worker's BLAS: this same command again, OpenBLAS and the shim preloaded)
    from worker.batch.engine import Engine

    with bench_env(model=args.model) as settings:
        engine = Engine.load(settings.model_path)
        asks = workload_prompts(args.workload, args.clients, 0, args.requests)
        prompts = [
            [engine.prompt_tokens(JobSpec(owner="b", model="m", messages=[{"role": "user", "content": p}])) for p in c]
            for c in asks
        ]
        print(
            f"{args.workload}: {args.clients} clients x {args.requests} prompts of {min(map(len, prompts[0]))}-"
            f"{max(map(len, prompts[0]))} tokens (the first client's), max_tokens {args.max_tokens}, floor "
            f"{args.floor} tok/s, speculation on: ONELANE_SPECULATE={args.speculate}; load {os.getloadavg()[0]:.2f}"
        )
        for vary in args.vary:
            limits = [
                [args.max_tokens + random.Random(f"{c}/{i}").randint(-vary, vary) for i in range(args.requests)]
                for c in range(args.clients)
            ]
            runs: dict[str, list[Run]] = {side: [] for side in SIDES}
            for r in range(args.rounds):
                print(f"-- max_tokens {args.max_tokens} +- {vary}, round {r + 1}", flush=True)
                for side in SIDES if r % 2 == 0 else reversed(SIDES):
                    run = loop(engine, prompts, limits, args.speculate if side == "on" else 0, args.floor)
                    runs[side].append(run)
                    print(line(side, run), flush=True)
            ratios = [on.rate / off.rate for on, off in zip(runs["on"], runs["off"])]
            print(
                f"max_tokens +- {vary}: tok/s off {spread([r.rate for r in runs['off']], '{:.1f}', short=True)}, on "
                f"{spread([r.rate for r in runs['on']], '{:.1f}', short=True)}; on/off "
                f"{spread(ratios, '{:.2f}', short=True)}x (round by round)"
            )
            if len(ratios) > 1:
                print(f"  (spread of on/off: {statistics.pstdev(ratios):.3f})")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (the default model, as float32), demo, or a folder")
    parser.add_argument("--workload", default="edit", choices=("edit", "quote", "json", "chat"))
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--vary", default="0,32", help="spreads of max_tokens, comma-separated")
    parser.add_argument("--floor", type=float, default=4.0, help="the decode floor, tokens/s (0: none)")
    parser.add_argument(
        "--speculate",
        type=int,
        default=Settings.model_fields["speculate"].default,
        help="the on side's ONELANE_SPECULATE",
    )
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    args.vary = [int(v) for v in args.vary.split(",")]
    if min(args.vary) < 0 or max(args.vary) >= args.max_tokens or args.clients < 1 or args.requests < 1:
        parser.error("--vary must lie in 0..max_tokens-1, --clients and --requests at least 1")
    return args


if __name__ == "__main__":
    main()
