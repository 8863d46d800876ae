"""Does streaming output through Redis slow generation? The engine alone vs the worker's runner.

Baseline: the same prompt and token count through `Engine.generate` alone (a batch of one, no Redis). Prints
tokens/s for both and the ratio. Run: ./dev.sh bench publish_overhead [--size tiny|small] [--tokens N] [--runs N]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from bench.common import bench_env
from tasks.job import JobSpec, SamplingParams, new_job_id
from tasks.store import Store, connect
from worker.engine import Engine
from worker.models import ModelPool
from worker.runner import Runner


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with bench_env(args.size) as settings:
        engine = Engine.load(settings.model_path)
        store = Store(connect(settings.effective_redis_url), settings)
        runner = Runner(store, ModelPool(store, "bench", engine), "bench", on_fatal=print)
        spec = JobSpec(
            owner="bench", model=settings.model_name, prompt="benchmark", params=SamplingParams(max_tokens=args.tokens, ignore_eos=True)
        )
        for _ in engine.generate(spec):  # warm up
            pass
        direct, queued, events = [], [], []

        def run_direct() -> None:
            started = time.perf_counter()
            for _ in engine.generate(spec):
                pass
            direct.append(time.perf_counter() - started)

        def run_queued() -> None:
            job = store.create(new_job_id(), spec, 600)
            assert store.take_device("bench") == "ok"  # this process plays the worker: hold the device lease
            started = time.perf_counter()
            assert runner.run_waiting(threading.Event()) == 1  # claims the job, runs it to its end
            runner.writer.settle()  # its end recorded
            queued.append(time.perf_counter() - started)
            done = store.get(job.id)
            assert done.usage.completion_tokens == args.tokens, done.usage
            events.append(sum(1 for e in store.events(job.id) if e["type"] == "token"))

        for n in range(args.runs):  # alternate which goes first, so neither gains from order
            for step in (run_direct, run_queued) if n % 2 == 0 else (run_queued, run_direct):
                step()
        d, q = statistics.median(direct), statistics.median(queued)
        print(f"model {args.size}, {args.tokens} tokens, median of {args.runs} runs")
        print(f"direct Engine.generate:        {d * 1000:8.1f} ms  {args.tokens / d:8.1f} tok/s")
        print(f"runner (Redis append+publish): {q * 1000:8.1f} ms  {args.tokens / q:8.1f} tok/s")
        print(f"overhead: {(q - d) * 1000:+.1f} ms ({(q / d - 1) * 100:+.2f} %), ratio {q / d:.3f} vs direct")
        print(f"token events per job (batched writes): median {statistics.median(events):.0f} for {args.tokens} tokens")


if __name__ == "__main__":
    main()
