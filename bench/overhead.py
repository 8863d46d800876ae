"""A job through onelane vs the same prompt with `stream_generate` in one process.

Direct: `Engine.generate` (mlx_lm.stream_generate) in this process: time to the first token and to the end.
Through onelane: the real stack (`onelane web` under gunicorn, a `python -m worker.main` process, Redis), one client
streaming `POST /v1/chat/completions`: time from sending the request to the first content delta, and to `[DONE]`;
plus the job's own generation time (started_at -> finished_at, Redis's clock). Both with OpenBLAS preloaded
when available (as onelane's workers run). Run: ./dev.sh bench overhead [--runs 20] [--tokens 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import requests

from bench._load import free_port, onelane_web, stop_group, web_env
from bench.common import bench_env
from tasks.job import JobSpec, Message, SamplingParams
from tasks.store import Store, connect
from worker.blas import worker_env

SEED = 7  # the same sampled tokens both ways (the random demo model at temperature 0 can emit bytes that
# decode to no text for a long while, which would hide the first token from a client)


def direct(model: str, messages: tuple[Message, ...], tokens: int, runs: int) -> tuple[list[float], list[float]]:
    from worker.engine import Engine

    engine = Engine.load(model)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=1.0, seed=SEED)
    spec = JobSpec(owner="b", model="m", messages=messages, params=params)
    list(engine.generate(spec))  # warm up
    first, total = [], []
    for _ in range(runs):
        started = time.perf_counter()
        seen = None
        for chunk in engine.generate(spec):
            if seen is None and chunk.text:  # the first token that shows as text, as a client sees it
                seen = time.perf_counter() - started
        first.append(seen if seen is not None else float("nan"))
        total.append(time.perf_counter() - started)
    return first, total


def through_onelane(port: int, tokens: int, runs: int, store: Store) -> tuple[list[float], list[float], list[float]]:
    body = {"model": store.settings.model_name, "messages": [{"role": "user", "content": "hello"}], "max_tokens": tokens,
            "stream": True, "ignore_eos": True, "temperature": 1.0, "seed": SEED}  # fmt: skip
    first, total, generation = [], [], []
    session = requests.Session()
    for n in range(runs + 1):
        started = time.perf_counter()
        seen_first = None
        with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, stream=True, timeout=60) as r:
            r.raise_for_status()
            job_id = r.headers["x-onelane-job-id"]
            for line in r.iter_lines(chunk_size=None, decode_unicode=True):  # as bytes arrive, not 512 at a time
                if seen_first is None and line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                    seen_first = time.perf_counter() - started
                if line == "data: [DONE]":
                    break
        if n == 0:
            continue  # warm up
        first.append(seen_first or float("nan"))
        total.append(time.perf_counter() - started)
        t = store.get(job_id).timings
        generation.append(t.finished_at - t.started_at)  # type: ignore[operator]
    return first, total, generation


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=200)
    args = parser.parse_args()
    env = worker_env(dict(os.environ))
    if env.get("LD_PRELOAD") != os.environ.get("LD_PRELOAD"):  # measure direct generation as workers run it
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    with bench_env("tiny", max_queue=1000, max_queued_per_user=1000) as settings:
        messages = (Message(role="user", content="hello"),)
        d_first, d_total = direct(settings.model_path, messages, args.tokens, args.runs)
        store = Store(connect(settings.effective_redis_url), settings)
        log = settings.var_dir / "worker.log"
        worker = subprocess.Popen([sys.executable, "-m", "worker.main"], env=web_env(settings), stdout=open(log, "wb"),
                                  stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            port = free_port()
            with onelane_web(settings, port, 1, settings.var_dir / "web.log"):
                deadline = time.monotonic() + 60
                while not store.snapshot().workers:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the worker never took the device")
                    time.sleep(0.05)
                o_first, o_total, o_gen = through_onelane(port, args.tokens, args.runs, store)
        finally:
            stop_group(worker, "worker")
    med = statistics.median
    print(f"tiny demo model, {args.tokens} tokens, chat prompt, median of {args.runs} runs, "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"time to first token: direct {med(d_first) * 1000:.2f} ms, through onelane (HTTP stream) "
          f"{med(o_first) * 1000:.2f} ms -> +{(med(o_first) - med(d_first)) * 1000:.2f} ms")  # fmt: skip
    print(f"whole job:           direct {med(d_total) * 1000:.1f} ms, through onelane end to end "
          f"{med(o_total) * 1000:.1f} ms -> +{(med(o_total) - med(d_total)) * 1000:.1f} ms "
          f"({(med(o_total) / med(d_total) - 1) * 100:+.1f} %)")  # fmt: skip
    print(f"generation alone (started -> finished in Redis): {med(o_gen) * 1000:.1f} ms -> "
          f"{(med(o_gen) / med(d_total) - 1) * 100:+.1f} % vs direct")  # fmt: skip
    print("targets: extra time <= 2 % and <= 5 ms; first token <= direct + 5 ms")
    print(json.dumps({"direct_first_ms": med(d_first) * 1000, "onelane_first_ms": med(o_first) * 1000}))


if __name__ == "__main__":
    main()
