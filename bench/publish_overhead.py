"""Does streaming output through Redis slow generation? The engine alone vs the worker's runner.

Baseline: the same prompt and token count through `Engine.generate` alone (a batch of one, no Redis). Prints
tokens/s for both and the ratio. Run: ./dev.sh bench publish_overhead [--size tiny|small] [--tokens N] [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from bench.harness import bench_env, generate
from tasks.events import EventType
from tasks.job import JobSpec, SamplingParams, new_job_id
from tasks.store import Store
from worker.batch.engine import Engine
from worker.models import ModelPool
from worker.runner.loop import Runner


def measure(engine: Engine, store: Store, spec: JobSpec, runs: int) -> tuple[list[float], list[float], list[int]]:
    """`runs` of each, alternating which goes first: (direct seconds, runner seconds, token events per job)."""
    bench = store.for_worker("bench")
    runner = Runner(bench, ModelPool(bench, engine), on_fatal=print)
    direct: list[float] = []
    queued: list[float] = []
    events: list[int] = []

    def run_direct() -> None:
        started = time.perf_counter()
        for _ in generate(engine, spec):
            pass
        direct.append(time.perf_counter() - started)

    def run_queued() -> None:
        job = store.get(store.admit(new_job_id(), spec, 600).id)
        assert store.for_worker("bench").take_device() == "ok"  # this process plays the worker: hold the device lease
        started = time.perf_counter()
        assert runner.run_waiting(threading.Event()) == 1  # claims the job, runs it to its end
        runner.writer.settle()  # its end recorded
        queued.append(time.perf_counter() - started)
        done = store.get(job.id)
        assert done.usage.completion_tokens == spec.params.max_tokens, done.usage
        events.append(sum(1 for e in store.events(job.id) if e.type is EventType.TOKEN))

    for _ in generate(engine, spec):  # warm up
        pass
    for n in range(runs):  # alternate which goes first, so neither gains from order
        for step in (run_direct, run_queued) if n % 2 == 0 else (run_queued, run_direct):
            step()
    return direct, queued, events


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with bench_env(args.size) as settings:
        engine = Engine.load(settings.model_path)
        params = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
        spec = JobSpec(owner="bench", model=settings.model_name, prompt="benchmark", params=params)
        direct, queued, events = measure(engine, Store.connect(settings), spec, args.runs)
    d, q = statistics.median(direct), statistics.median(queued)
    print(f"model {args.size}, {args.tokens} tokens, median of {args.runs} runs")
    print(f"direct Engine.generate:        {d * 1000:8.1f} ms  {args.tokens / d:8.1f} tok/s")
    print(f"runner (Redis append+publish): {q * 1000:8.1f} ms  {args.tokens / q:8.1f} tok/s")
    print(f"overhead: {(q - d) * 1000:+.1f} ms ({(q / d - 1) * 100:+.2f} %), ratio {q / d:.3f} vs direct")
    print(f"token events per job (batched writes): median {statistics.median(events):.0f} for {args.tokens} tokens")


if __name__ == "__main__":
    main()
