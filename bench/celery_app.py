"""The Celery baseline: the app its solo worker runs (a no-op task that records when it started, and a gate), and
`run`, which starts that worker on a Redis and times it (bench/celery_baseline.py and bench/pickup.py call it).

The worker reads its broker from ONELANE_BENCH_BROKER and the Redis it records into from ONELANE_BENCH_REDIS.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from functools import cache
from pathlib import Path

import redis
from celery import Celery

BROKER_ENV = "ONELANE_BENCH_BROKER"
REDIS_ENV = "ONELANE_BENCH_REDIS"
QUEUE = "bench"
STARTED_KEY = "bench:celery:started"
GATE_KEY = "bench:celery:gate"
IDLE_PAUSE_S = 0.05
WAIT_S = 30.0  # longest wait for any one batch of starts: a stuck worker fails the run, never hangs it
WORKER_START_S = 60.0

app = Celery("onelane_bench", broker=os.environ.get(BROKER_ENV), set_as_current=False)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)

# --- the worker's side ----------------------------------------------------------------------------------------


@cache
def _recorder() -> redis.Redis:
    """The Redis the tasks record start times into (one connection per worker process)."""
    return redis.Redis.from_url(os.environ[REDIS_ENV])


@app.task(name="bench.noop")
def noop(sample: int) -> None:
    """The job body: record the start time (seconds since the epoch) for `sample`, then return."""
    started = time.time()
    _recorder().rpush(STARTED_KEY, f"{sample} {started!r}")


@app.task(name="bench.gate")
def gate(key: str, timeout_s: float) -> None:
    """Hold the worker until `key` is pushed (bounded), so a backlog can pile up behind it."""
    _recorder().rpush(STARTED_KEY, f"-1 {time.time()!r}")
    _recorder().blpop([key], timeout=timeout_s)


# --- the benchmark's side -------------------------------------------------------------------------------------


def broker_url(redis_url: str) -> str:
    """kombu spells a unix socket `redis+socket:///path` where redis-py spells it `unix:///path`."""
    if redis_url.startswith("unix://"):
        return "redis+socket://" + redis_url.removeprefix("unix://")
    return redis_url


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


def run(url: str, n: int = 200) -> dict[str, list[float]]:
    """A `celery worker --pool=solo` on the Redis at `url`: pickup latencies, back-to-back gaps and drain time (s)."""
    from bench.harness import spawn  # here, not above: the worker process imports this module too

    app.conf.broker_url = broker_url(url)
    client = redis.Redis.from_url(url)
    env = {**os.environ, BROKER_ENV: broker_url(url), REDIS_ENV: url, "PYTHONPATH": str(Path(__file__).parents[1])}
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "bench.celery_app",
        "worker",
        "--pool=solo",
        "--concurrency=1",
        "--prefetch-multiplier=1",
        "-Q",
        QUEUE,
        # no gossip/mingle/heartbeat: cluster chatter would only add noise to a one-worker measurement
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--loglevel=WARNING",
    ]
    try:
        with tempfile.TemporaryDirectory(prefix="onelane-celery-") as tmp, spawn(cmd, Path(tmp) / "worker.log", env):
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
