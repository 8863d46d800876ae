"""The continuous batch, measured on this machine: what it gains, and what it costs the jobs in it.

    ./dev.sh bench batching [--size tiny|small] [--runs 5] [--parts speedup,cancel,stall,sweep]

- speedup: 8 and 32 jobs of 64 tokens (greedy, ignore_eos) admitted at once and run by the real worker (in this
  process: dramatiq, Redis, the writer thread, the listener) with ONELANE_MAX_BATCH=1, the baseline, and with a
  batch of `--batch` (default: the setting's default). Wall time from the first admission to the last end, by
  Redis's clock; the two alternate run by run.
- cancel: a full batch of `--batch` jobs of 400 tokens; one is cancelled once it has 20 tokens. Tokens it
  generated after the worker heard the cancel, the time from the cancel to its end, and whether every other
  job's output equals the same job run alone.
- stall: the engine alone, 8 sequences decoding; a 2000-token prompt joins. The longest step while it prefills,
  against the median step before it joined (ms, and as a multiple), for each prefill chunk of --prefill-steps
  (ONELANE_PREFILL_STEP's default among them, and mlx-lm's own 2048: the prompt in one piece), and the step once
  it has joined (every sequence of the batch then attends over the long one's length).
- sweep: 32 jobs of 64 tokens at batch sizes 1, 4, 8, 16, 32: tokens/s and the jobs' median and p99 latency
  (admission to end), to choose the default.

Every figure is measured in this run; medians over `--runs`, with min and max.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.harness import InProcess, admit, bench_env, generate, poll_until, prompt, wait_ended
from bench.report import pct, spread
from tasks import keys
from tasks.job import JobSpec, SamplingParams
from tasks.settings import Settings
from worker.blas import preload_openblas


class Bench(InProcess):
    """A private Redis, the demo model loaded once, and the real worker started in this process per batch size."""

    def admit(self, text: str, **params: Any) -> str:
        return admit(self.store, self.broker, f"u{len(text) % 7}", text, **params)

    def wait_ended(self, ids: list[str], timeout_s: float = 600.0) -> list[Any]:
        assert not wait_ended(self.store, ids, timeout_s, every_s=0.01), "jobs did not end in time"
        return [self.store.get(job_id) for job_id in ids]

    def closed_batch(self, n: int, tokens: int = 64) -> tuple[float, list[float]]:
        """n jobs admitted at once: (wall seconds from the first admission to the last end, each job's latency)."""
        ids = [self.admit(prompt(k), max_tokens=tokens, ignore_eos=True) for k in range(n)]
        jobs = self.wait_ended(ids)
        assert all(j.usage.completion_tokens == tokens for j in jobs), [j.status for j in jobs]
        first = min(j.timings.queued_at for j in jobs)
        wall = max(j.timings.finished_at for j in jobs) - first  # type: ignore[operator]
        return wall, [j.timings.finished_at - j.timings.queued_at for j in jobs]  # type: ignore[operator]


def speedup(b: Bench, runs: int, batch: int) -> None:
    print(f"\n== batched (ONELANE_MAX_BATCH={batch}) vs one at a time (ONELANE_MAX_BATCH=1), 64 tokens per job")
    for n in (8, 32):
        walls: dict[int, list[float]] = {1: [], batch: []}
        for run in range(runs):
            for size in (1, batch) if run % 2 == 0 else (batch, 1):
                with b.worker(max_batch=size):
                    b.closed_batch(2)  # warm up at this size
                    walls[size].append(b.closed_batch(n)[0])
        one, many = walls[1], walls[batch]
        ratios = [o / m for o, m in zip(one, many)]
        print(
            f"  {n:>2} jobs: one at a time {n * 64 / statistics.median(one):7.0f} tok/s, "
            f"batched {n * 64 / statistics.median(many):7.0f} tok/s; speed-up {spread(ratios, '{:.2f}')}×"
        )
        print(
            f"           wall one at a time {spread([w * 1000 for w in one])} ms; batched {spread([w * 1000 for w in many])} ms"
        )


def cancel(b: Bench, runs: int, batch: int) -> None:
    print(f"\n== cancel inside a full batch ({batch} jobs of 400 tokens; one cancelled at 20 tokens)")
    after, to_end, unchanged = [], [], []
    texts = [prompt(k, 5 + 3 * k) for k in range(batch)]
    outputs: list[list[str]] = []
    for _ in range(runs):
        with b.worker(max_batch=batch):
            ids = [b.admit(text, max_tokens=400, ignore_eos=True) for text in texts]
            victim = ids[batch // 2]
            assert poll_until(lambda: b.store.get(victim).usage.completion_tokens >= 20, 60, every_s=0.002)
            asked = time.time()
            b.store.cancel(victim, b.store.get(victim).owner, wait_s=5)
            jobs = b.wait_ended(ids)
            gone = next(j for j in jobs if j.id == victim)
            seen = int(b.store.redis.hget(keys.job(victim), "stop_seen_at") or -1)
            after.append(gone.usage.completion_tokens - seen)
            to_end.append((gone.timings.finished_at - asked) * 1000)  # type: ignore[operator]
            outputs.append([j.output for j in jobs if j.id != victim])
    alone = [_alone(b, text, 400) for n, text in enumerate(texts) if n != batch // 2]
    unchanged = [sum(o == a for o, a in zip(run, alone)) for run in outputs]
    print(f"  tokens generated after the worker heard the cancel: {after} (target <= 1)")
    print(f"  cancel -> the job's end recorded: {spread(to_end, '{:.1f}')} ms")
    print(f"  other jobs' outputs equal to each run alone: {unchanged} of {batch - 1} per run")


def _alone(b: Bench, text: str, tokens: int) -> str:
    spec = JobSpec(owner="b", model="m", prompt=text, params=SamplingParams(max_tokens=tokens, ignore_eos=True))
    return "".join(c.text for c in generate(b.engine, spec))


def stall(b: Bench, runs: int, default_step: int, steps: list[int]) -> None:
    print("\n== decode stall: a 2000-token prompt joins a batch of 8 decoding sequences (engine alone)")
    long_prompt = b.engine.tokenizer.encode(" ".join(prompt(k) for k in range(200)))[:2000]
    assert len(long_prompt) == 2000, len(long_prompt)
    for step in steps:
        normal, worst, extra, joins, after = [], [], [], [], []
        for _ in range(runs):
            n, w, e, s, a = _join_once(b, long_prompt, step)
            normal.append(n)
            worst.append(w)
            extra.append(e)
            joins.append(s)
            after.append(a)
        ratio = [w / n for w, n in zip(worst, normal)]
        label = (
            " (ONELANE_PREFILL_STEP default)" if step == default_step else " (mlx-lm's default)" if step == 2048 else ""
        )
        print(
            f"  prefill {step:>4} tokens a step{label}: normal step {spread(normal, '{:.2f}')} ms; longest step while "
            f"it joins {spread(worst, '{:.1f}')} ms = {spread(ratio, '{:.1f}')}x a normal step; "
            f"{statistics.median(joins):.0f} steps to join, {statistics.median(extra):.0f} ms added in all; "
            f"a step once it has joined (9 sequences, one 2000 tokens long) {spread(after, '{:.2f}')} ms"
        )


def _join_once(b: Bench, long_prompt: list[int], prefill_step: int) -> tuple[float, float, float, int, float]:
    engine = b.engine
    params = SamplingParams(max_tokens=100_000, ignore_eos=True)
    with engine.lock:
        engine.configure(16, prefill_step)
        uids = [engine.insert(engine.tokenizer.encode(prompt(k)), params) for k in range(8)]
        timed = lambda: _timed(engine.step)  # noqa: E731
        while len(timed()[1]) < 8:  # until all 8 generate
            pass
        normal = statistics.median(timed()[0] for _ in range(40))
        joining = engine.insert(long_prompt, params)
        times = []
        while True:
            took, tokens = timed()
            times.append(took)
            if any(t.uid == joining for t in tokens):
                break
        after = statistics.median(timed()[0] for _ in range(20))
        engine.reset()
    del uids
    return normal, max(times), sum(times) - normal * len(times), len(times), after


def _timed(step: Callable[[], list[Any]]) -> tuple[float, list[Any]]:
    started = time.perf_counter()
    tokens = step()
    return (time.perf_counter() - started) * 1000, tokens


def sweep(b: Bench, runs: int) -> None:
    print("\n== batch size sweep: 32 jobs of 64 tokens admitted at once")
    for size in (1, 4, 8, 16, 32):
        rates, p50, p99 = [], [], []
        with b.worker(max_batch=size):
            b.closed_batch(2)
            for _ in range(runs):
                wall, latencies = b.closed_batch(32)
                rates.append(32 * 64 / wall)
                p50.append(pct(latencies, 50) * 1000)
                p99.append(pct(latencies, 99) * 1000)
        print(f"  batch {size:>2}: {spread(rates)} tok/s; job latency p50 {spread(p50)} ms, p99 {spread(p99)} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--model", help="a model folder (instead of a random one of --size)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=Settings().max_batch)
    parser.add_argument("--parts", default="speedup,cancel,stall,sweep")
    parser.add_argument("--prefill-steps", default="64,128,256,512,2048", help="prefill chunks the stall part tries")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    preload_openblas()  # as onelane's workers run

    print(f"model {args.model or 'random, ' + args.size}; load average {os.getloadavg()[0]:.2f}; runs {args.runs}")
    with bench_env(args.size, args.model, max_queue=1000, max_queued_per_user=1000) as settings:
        b = Bench(settings)
        if "speedup" in parts:
            speedup(b, args.runs, args.batch)
        if "cancel" in parts:
            cancel(b, args.runs, args.batch)
        if "stall" in parts:
            stall(b, args.runs, settings.prefill_step, [int(n) for n in args.prefill_steps.split(",")])
        if "sweep" in parts:
            sweep(b, args.runs)


if __name__ == "__main__":
    main()
