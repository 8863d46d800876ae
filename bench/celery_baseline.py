"""Baseline: Celery 5 with the solo pool on a private Redis, running the same no-op job body as onelane.

Two figures: pickup latency on an idle worker (task start - send time, ~50 ms apart so the worker is
idle each time) and the gap between back-to-back jobs (start-to-start of a backlog drained at once).
Run: .venv/bin/python -m bench.celery_baseline [--n 200]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import celery
import redis

from bench.celery_app import BROKER_ENV, QUEUE, REDIS_ENV, STARTED_KEY, app, gate, noop
from bench.common import bench_env, stop_process, summary
from tasks.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
GATE_KEY = "bench:celery:gate"
IDLE_PAUSE_S = 0.05
WAIT_S = 30.0  # longest wait for any one batch of starts: a stuck worker fails the run, never hangs it
WORKER_START_S = 60.0


def broker_url(redis_url: str) -> str:
    """kombu spells a unix socket `redis+socket:///path` where redis-py spells it `unix:///path`."""
    if redis_url.startswith("unix://"):
        return "redis+socket://" + redis_url.removeprefix("unix://")
    return redis_url


@contextmanager
def celery_worker(redis_url: str, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A `celery worker --pool=solo` subprocess on the bench queue; stopped (then killed) on exit."""
    env = {**os.environ, BROKER_ENV: broker_url(redis_url), REDIS_ENV: redis_url, "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker",
        "--pool=solo", "--concurrency=1", "--prefetch-multiplier=1", "-Q", QUEUE,
        # no gossip/mingle/heartbeat: cluster chatter would only add noise to a one-worker measurement
        "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=WARNING",
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        yield process
    finally:
        stop_process(process)


def wait_started(client: redis.Redis, count: int, timeout_s: float = WAIT_S) -> list[tuple[int, float]]:
    """Pop `count` (sample, start time) records the tasks pushed; raise if they do not come in time."""
    records: list[tuple[int, float]] = []
    deadline = time.monotonic() + timeout_s
    while len(records) < count:
        left = deadline - time.monotonic()
        popped = client.blpop([STARTED_KEY], timeout=max(0.01, left)) if left > 0 else None
        if popped is None:
            raise TimeoutError(f"only {len(records)} of {count} tasks started within {timeout_s:.0f} s")
        raw = popped[1]
        sample, started = (raw.decode() if isinstance(raw, bytes) else raw).split()
        records.append((int(sample), float(started)))
    return records


def pickup_latency(client: redis.Redis, n: int) -> list[float]:
    """Send one no-op at a time to an idle worker; task start - send time, n samples."""
    samples = []
    for i in range(n):
        sent = time.time()
        noop.apply_async((i,), queue=QUEUE)
        [(sample, started)] = wait_started(client, 1)
        assert sample == i, (sample, i)
        samples.append(started - sent)
        time.sleep(IDLE_PAUSE_S)
    return samples


def back_to_back_gaps(client: redis.Redis, n: int) -> tuple[list[float], float]:
    """Hold the worker on a gate, enqueue n no-ops, release it: the start-to-start gaps and the drain time."""
    client.delete(GATE_KEY)
    gate.apply_async((GATE_KEY, WAIT_S), queue=QUEUE)
    wait_started(client, 1)
    for i in range(n):
        noop.apply_async((i,), queue=QUEUE)
    client.rpush(GATE_KEY, "go")
    starts = sorted(started for _, started in wait_started(client, n))
    return [b - a for a, b in zip(starts, starts[1:])], starts[-1] - starts[0]


def warm_up(client: redis.Redis, count: int = 5) -> None:
    """Wait for the worker to come up and run a few tasks, so imports and connections are done."""
    for i in range(count):
        noop.apply_async((-1 - i,), queue=QUEUE)
        wait_started(client, 1, timeout_s=WORKER_START_S if i == 0 else WAIT_S)


def run(settings_or_url: Settings | str, n: int = 200) -> dict[str, list[float]]:
    """Start a solo-pool worker on that Redis; return pickup latencies, back-to-back gaps and drain time (s)."""
    url = settings_or_url.effective_redis_url if isinstance(settings_or_url, Settings) else settings_or_url
    app.conf.broker_url = broker_url(url)
    client = redis.Redis.from_url(url)
    try:
        with tempfile.TemporaryDirectory(prefix="onelane-celery-") as tmp, celery_worker(url, Path(tmp) / "worker.log"):
            try:
                client.delete(STARTED_KEY)
                warm_up(client)
                pickup = pickup_latency(client, n)
                gaps, drain = back_to_back_gaps(client, n)
            except TimeoutError:
                print((Path(tmp) / "worker.log").read_text()[-4000:], file=sys.stderr)
                raise
    finally:
        app.close()  # drops the producer pool, so a later run may use another broker
        client.close()
    return {"pickup": pickup, "gap": gaps, "drain": [drain]}


def main() -> None:
    """Run both figures on a fresh private Redis and print them."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200, help="samples per figure")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with bench_env() as settings:
        figures = run(settings, args.n)
    drain = figures["drain"][0]
    print(f"celery {celery.__version__}, solo pool, Redis on a unix socket, no-op job body; "
          f"load average {load:.2f} before, {os.getloadavg()[0]:.2f} after")  # fmt: skip
    print(f"celery solo: pickup (idle worker) {summary(figures['pickup'])}")
    print(f"celery solo: back-to-back gap {summary(figures['gap'])}")
    print(f"celery solo: drained {args.n} queued jobs in {drain * 1000:.1f} ms ({(args.n - 1) / drain:.0f} jobs/s)")


if __name__ == "__main__":
    main()
