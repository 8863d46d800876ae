"""Two models behind one queue: how many model switches the bounded scheduler saves, what it gains in throughput,
and what it costs the job it passes over.

    ./dev.sh bench models [--sizes tiny,small] [--jobs 60] [--users 4] [--tokens 32] [--rate 10]
                          [--switch-wait 2] [--rounds 3] [--budgets one,both] [--seed 0]

Two demo models of different sizes are built offline ("small", ~25 M parameters, is the one whose batches take
long and whose load costs something). Each run starts the real worker in this process (dramatiq, Redis, the writer
thread, the listener) with both models served, and admits `--jobs` jobs of `--tokens` tokens (greedy, ignore_eos)
as an open stream at `--rate` jobs/s, above what either scheduler serves, so the queue stays non-empty: job k
belongs to user k mod `--users` and asks for one of the two models at random (seeded; the same traffic for both
variants of a round). The same traffic runs twice per round, with ONELANE_MODEL_SWITCH_WAIT_S = `--switch-wait`
(bounded) and = 0 (strict fair order: the worker switches model whenever the head of the queue needs the other
one, the baseline); the variant that goes first alternates round by round.

Memory budgets (ONELANE_MODELS_MEMORY): "one" holds only the bigger model (its size plus half the smaller's), so
every switch evicts a model and reloads the other, as Ollama with one model loaded; "both" holds both.

Per run:
- switches/100 jobs: model changes in the order the jobs started (by `started_at`), per 100 jobs; the worker's
  `model_switches` counter is shown beside it (it also counts the first batch, so it is about one higher);
- loads: models the worker loaded during the run (the default model, loaded at start, not counted), and their
  load seconds in all;
- throughput: jobs (and tokens) per second from the first admission to the last end, by Redis's clock;
- queue wait: admission to start, p50 and max (with the queue growing, the baseline's is mostly backlog);
- head wait: for each job seen at the head of the fair order, its start minus when it was first seen there
  (a sampler reads the queue's head and Redis's clock every 5 ms): what a job waits once nobody is ahead of it in
  fairness, i.e. the batch draining, the load, and in the bounded variant the time it is passed over (at most
  the switch wait). Its max is the "longest extra wait of a head job".

Every figure is measured in this run: medians over the rounds, with min and max, and the ratio bounded / strict
of each round.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import admit, private_redis, prompt, rotated, running_worker, wait_ended
from bench.report import pct, spread
from tasks import keys
from tasks.broker import make_broker
from tasks.catalogue import ModelConfig
from tasks.settings import Settings
from tasks.store import Store
from worker.blas import preload_openblas

SAMPLE_S = 0.005


@dataclass
class Run:
    switches: float  # per 100 jobs, from the order of started_at
    counter: int  # the worker's model_switches counter, this run
    loads: int
    load_s: float
    jobs_s: float
    tokens_s: float
    wait_p50: float
    wait_max: float
    head_max: float
    heads: int  # jobs seen at the head
    empty: float  # share of samples, while jobs were still arriving, with nothing queued
    failed: int = 0


class HeadSampler(threading.Thread):
    """Reads the fair order's head (and Redis's clock) every SAMPLE_S: when each job was first seen there."""

    def __init__(self, client: Any) -> None:
        super().__init__(name="head-sampler", daemon=True)
        self.redis = client
        self.first_head: dict[str, float] = {}
        self.samples = 0
        self.empty = 0
        self.counting = True  # count empty-queue samples (while jobs still arrive)
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            pipe = self.redis.pipeline(transaction=False)
            pipe.zrange(keys.QUEUE, 0, 0)
            pipe.time()
            head, (sec, usec) = pipe.execute()
            now = sec + usec / 1e6
            if head:
                self.first_head.setdefault(head[0], now)
            if self.counting:
                self.samples += 1
                self.empty += not head
            self.stopping.wait(SAMPLE_S)


def run_once(settings: Settings, traffic: list[tuple[str, str]], tokens: int, rate: float) -> Run:
    """The traffic through the real worker in this process, the head sampler watching; the run's figures."""
    store = Store.connect(settings)
    broker = make_broker(settings, worker=False)
    before = int(store.redis.hget(keys.STATS, "model_switches") or 0)
    loads: list[float] = []
    sampler = HeadSampler(store.redis)
    with running_worker(settings) as worker:
        count_loads(worker, loads)
        sampler.start()
        try:
            ids = arrivals(store, broker, traffic, tokens, rate)
            sampler.counting = False
            assert not wait_ended(store, ids, 600), "jobs did not end in time"
        finally:
            sampler.stopping.set()
            sampler.join()
    broker.close()
    after = int(store.redis.hget(keys.STATS, "model_switches") or 0)
    return figures([store.get(job_id) for job_id in ids], tokens, after - before, loads, sampler)


def count_loads(worker: Any, loads: list[float]) -> None:
    """Note the seconds of every model load after the default model's, as the worker adopts the model."""
    adopt = worker.models._adopt

    def counted(name: str, engine: Any, load_s: float) -> None:
        loads.append(load_s)
        adopt(name, engine, load_s)

    worker.models._adopt = counted


def arrivals(store: Store, broker: Any, traffic: list[tuple[str, str]], tokens: int, rate: float) -> list[str]:
    """The traffic admitted as an open stream of `rate` jobs per second; their ids."""
    ids: list[str] = []
    started = time.monotonic()
    for k, (owner, model) in enumerate(traffic):
        delay = started + k / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        ids.append(admit(store, broker, owner, prompt(k, 10), model, max_tokens=tokens, ignore_eos=True))
    return ids


def figures(jobs: list[Any], tokens: int, counter: int, loads: list[float], sampler: HeadSampler) -> Run:
    """A run's figures from its jobs' records, the worker's counter, the loads and what the sampler saw."""
    done = [j for j in jobs if j.status.value == "completed" and j.usage.completion_tokens == tokens]
    order = sorted((j for j in jobs if j.timings.started_at is not None), key=lambda j: j.timings.started_at)
    changes = sum(a.spec.model != b.spec.model for a, b in zip(order, order[1:]))
    first = min(j.timings.queued_at for j in jobs)
    last = max(j.timings.finished_at or 0.0 for j in jobs)
    waits = [j.timings.started_at - j.timings.queued_at for j in order]  # type: ignore[operator]
    heads = [j.timings.started_at - sampler.first_head[j.id] for j in order if j.id in sampler.first_head]  # type: ignore[operator]
    return Run(
        switches=100 * changes / len(jobs),
        counter=counter,
        loads=len(loads),
        load_s=sum(loads),
        jobs_s=len(done) / (last - first),
        tokens_s=len(done) * tokens / (last - first),
        wait_p50=pct(waits, 50),
        wait_max=max(waits),
        head_max=max(heads, default=0.0),
        heads=len(heads),
        empty=sampler.empty / max(1, sampler.samples),
        failed=len(jobs) - len(done),
    )


ROWS: list[tuple[str, str, str]] = [  # (Run attribute, label, format)
    ("switches", "switches / 100 jobs", "{:.1f}"),
    ("counter", "  (worker counter)", "{:.0f}"),
    ("loads", "model loads", "{:.0f}"),
    ("load_s", "  load time, s", "{:.2f}"),
    ("jobs_s", "throughput, jobs/s", "{:.2f}"),
    ("tokens_s", "throughput, tok/s", "{:.0f}"),
    ("wait_p50", "queue wait p50, s", "{:.2f}"),
    ("wait_max", "queue wait max, s", "{:.2f}"),
    ("head_max", "head wait max, s", "{:.2f}"),
    ("empty", "queue empty (arrivals)", "{:.0%}"),
]
RATIOS = ("switches", "jobs_s", "wait_max", "head_max")


def report(title: str, bounded: list[Run], strict: list[Run], wait_s: float) -> None:
    print(f"\n== {title}")
    left = f"bounded ({wait_s:g} s)"
    print(f"  {'':<24} {left:>22} {'strict (0 s)':>22} {'bounded / strict':>22}")
    for attr, label, fmt in ROWS:
        b = [float(getattr(r, attr)) for r in bounded]
        s = [float(getattr(r, attr)) for r in strict]
        ratio = ""
        if attr in RATIOS:
            pairs = [x / y if y else float("nan") for x, y in zip(b, s)]
            ratio = spread(pairs, "{:.2f}x", short=True)
        print(f"  {label:<24} {spread(b, fmt, short=True):>22} {spread(s, fmt, short=True):>22} {ratio:>22}")
    failed = sum(r.failed for r in bounded + strict)
    if failed:
        print(f"  ! {failed} job(s) did not complete with all their tokens")


def measure(base: Settings, budget: str, sizes: list[str], args: argparse.Namespace) -> dict[float, list[Run]]:
    """`--rounds` rounds of the same traffic, bounded and strict, the variant that goes first alternating."""
    results: dict[float, list[Run]] = {args.switch_wait: [], 0.0: []}
    for r in range(args.rounds):
        rng = random.Random(args.seed * 1000 + r)
        traffic = [(f"u{k % args.users}", rng.choice(sizes)) for k in range(args.jobs)]
        for wait_s in rotated((args.switch_wait, 0.0), r):
            run = run_once(base.model_copy(update={"model_switch_wait_s": wait_s}), traffic, args.tokens, args.rate)
            results[wait_s].append(run)
            print(
                f"  [{budget}, round {r + 1}, wait {wait_s:g} s] switches/100 {run.switches:.0f}, "
                f"loads {run.loads}, {run.jobs_s:.2f} jobs/s, queue wait max {run.wait_max:.1f} s, "
                f"head wait max {run.head_max:.2f} s ({run.heads} heads seen)",
                flush=True,
            )
    return results


def main() -> None:
    args = parse_args()
    sizes, budgets = args.sizes.split(","), args.budgets.split(",")
    preload_openblas()  # as onelane's workers run
    logging.basicConfig(level=logging.WARNING)
    began = time.monotonic()
    print(
        f"models {sizes[0]} + {sizes[1]}; {args.jobs} jobs of {args.tokens} tokens at {args.rate:g}/s from "
        f"{args.users} users, models at random; switch wait {args.switch_wait:g} s vs 0; {args.rounds} rounds; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    with private_redis() as (folder, url):
        configs, memory = demo_models(folder, sizes)
        for budget in budgets:
            base = Settings(
                redis_url=url,
                var_dir=folder,
                models=configs,
                models_memory=memory[budget],
                max_queue=10_000,
                max_queued_per_user=10_000,
            )
            results = measure(base, budget, sizes, args)
            title = f"memory budget {memory[budget] / 2**20:.0f} MiB: " + (
                "one model at a time (every switch evicts and reloads)"
                if budget == "one"
                else "both models stay loaded"
            )
            report(title, results[args.switch_wait], results[0.0], args.switch_wait)
    print(f"\nmedian (min-max) over {args.rounds} rounds; ratios per round; took {time.monotonic() - began:.0f} s")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="tiny,small", help="the two demo models' sizes (tiny, mini, small)")
    parser.add_argument("--jobs", type=int, default=60, help="jobs per run")
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32, help="tokens per job")
    parser.add_argument("--rate", type=float, default=10.0, help="arrivals per second (open stream)")
    parser.add_argument("--switch-wait", type=float, default=2.0, help="ONELANE_MODEL_SWITCH_WAIT_S under test")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budgets", default="one,both", help="memory budgets: one (every switch reloads), both")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sizes = args.sizes.split(",")
    assert len(sizes) == 2 and sizes[0] != sizes[1], "--sizes: two different sizes"
    assert set(args.budgets.split(",")) <= {"one", "both"}, "--budgets: one, both"
    return args


def demo_models(folder: Path, sizes: list[str]) -> tuple[tuple[ModelConfig, ...], dict[str, int]]:
    """The two demo models, built offline (the first the default), and the memory budgets for them: "one" holds
    only the bigger (its size plus half the smaller's), "both" holds both."""
    from worker.demo_build.model import make_demo_model
    from worker.models import size_on_disk

    configs = tuple(
        ModelConfig(name=size, path=str(make_demo_model(folder / size, size=size)), default=n == 0)
        for n, size in enumerate(sizes)
    )
    bytes_ = [size_on_disk(c) for c in configs]
    memory = {"one": max(bytes_) + min(bytes_) // 2, "both": 2 * sum(bytes_)}
    print("model sizes: " + ", ".join(f"{c.name} {b / 2**20:.1f} MiB" for c, b in zip(configs, bytes_)))
    return configs, memory


if __name__ == "__main__":
    main()
