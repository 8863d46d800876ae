"""The Celery app the Celery baseline runs: a no-op task that records when it started, and a gate.

The worker reads its broker from ONELANE_BENCH_BROKER and the Redis it records into from
ONELANE_BENCH_REDIS (both set by bench/celery_baseline.py). Run by that script, not by hand.
"""

from __future__ import annotations

import os
import time
from functools import cache

import redis
from celery import Celery

BROKER_ENV = "ONELANE_BENCH_BROKER"
REDIS_ENV = "ONELANE_BENCH_REDIS"
QUEUE = "bench"
STARTED_KEY = "bench:celery:started"

app = Celery("onelane_bench", broker=os.environ.get(BROKER_ENV), set_as_current=False)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


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
