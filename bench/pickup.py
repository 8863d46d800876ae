"""Pickup latency and the gap between back-to-back jobs: onelane vs Celery (solo) vs stock dramatiq.

All three run in this one process's run, on the same machine and a private Redis each:
- onelane: a real worker process (`python -m worker.main`), jobs admitted the way the web admits them
  (store.admit with the job's dramatiq message); pickup = started_at - queued_at, both stamped by Redis's
  clock at the admission and the claim; the gap = next started_at - previous finished_at in a drained
  backlog. The bench waits for each job's end on its pub/sub channel (no polling to take CPU meanwhile).
- Celery 5, solo pool, prefetch 1 (bench/celery_baseline.py): pickup = task start - send; the gap is
  start-to-start of no-op tasks.
- stock dramatiq (its RedisBroker, polling consumer), one thread, prefetch 1, at its default 1000 ms
  worker timeout and at 100 ms: the same no-op body as Celery's.
Also the Redis commands per second an idle onelane worker costs (INFO total_commands_processed).
Run: ./dev.sh bench pickup [--n 200]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from bench.common import bench_env, pct, summary
from tasks import keys
from tasks.broker import QUEUE_NAME, Doorbell
from tasks.job import JobSpec, SamplingParams, new_job_id
from tasks.settings import Settings
from tasks.store import TERMINAL_EVENTS, Store, connect
from worker.main import IDLE_WAIT_MS

IDLE_PAUSE_S = 0.05  # between pickup samples, so the worker is idle (blocked) each time


def start_worker(settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "REDIS_URL": settings.effective_redis_url, "ONELANE_MODEL": settings.model_path,
           "ONELANE_VAR_DIR": str(settings.var_dir)}  # fmt: skip
    return subprocess.Popen([sys.executable, "-m", "worker.main"], env=env, stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT)  # fmt: skip


def admit(store: Store, broker: RedisBroker, max_tokens: int = 1, owner: str = "bench", job_id: str = "") -> str:
    """The web's admission path: the job and its message in one script."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    job_id = job_id or new_job_id()
    spec = JobSpec(owner=owner, model=store.settings.model_name, prompt="x", params=params)
    store.admit(job_id, spec, 600, doorbell=Doorbell.ring(broker, job_id))
    return job_id


def admit_and_wait(store: Store, broker: RedisBroker, timeout_s: float = 60) -> str:
    """Admit one job and block (on its channel, subscribed first) until it ends."""
    job_id = new_job_id()
    deadline = time.monotonic() + timeout_s
    with store.redis.pubsub() as sub:
        sub.subscribe(keys.channel(job_id))
        while (message := sub.get_message(timeout=timeout_s)) is None or message["type"] != "subscribe":
            pass
        admit(store, broker, job_id=job_id)
        while (left := deadline - time.monotonic()) > 0:
            message = sub.get_message(timeout=left)
            if message is not None and json.loads(message["data"])["e"]["type"] in TERMINAL_EVENTS:
                return job_id
    raise TimeoutError(f"job {job_id} did not end")


def wait_done(store: Store, job_id: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not store.get(job_id).status.ended:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} did not end")
        time.sleep(0.01)


def onelane(n: int) -> dict[str, list[float]]:
    from tasks.broker import make_broker

    with bench_env("tiny", max_queue=10_000, max_queued_per_user=10_000) as settings:
        store = Store(connect(settings.effective_redis_url), settings)
        broker = make_broker(settings)
        worker = start_worker(settings, settings.var_dir / "worker.log")
        try:
            admit_and_wait(store, broker)  # the worker is up and warm
            pickups = []
            for _ in range(n):
                time.sleep(IDLE_PAUSE_S)
                job_id = admit_and_wait(store, broker)
                t = store.get(job_id).timings
                pickups.append(t.started_at - t.queued_at)  # type: ignore[operator]

            blocker = admit(store, broker, max_tokens=100_000)
            while store.get(blocker).timings.started_at is None:
                time.sleep(0.001)
            backlog = [admit(store, broker) for _ in range(n)]
            store.cancel(blocker, "bench")
            for job_id in backlog:
                wait_done(store, job_id)
            timings = sorted((store.get(j).timings for j in backlog), key=lambda t: t.started_at or 0)
            gaps = [b.started_at - a.finished_at for a, b in zip(timings, timings[1:])]  # type: ignore[operator]

            # every admitted job rang its doorbell: let the worker drop those of jobs already run, then idle
            doorbells = keys.dramatiq_queue(broker.namespace, QUEUE_NAME)
            while store.redis.llen(doorbells):
                time.sleep(0.1)
            time.sleep(IDLE_WAIT_MS / 1000)
            idle = idle_commands_per_s(store.redis)
        finally:
            worker.terminate()
            worker.wait(timeout=30)
    return {"pickup": pickups, "gap": gaps, "idle_cmds": list(idle)}


def idle_commands_per_s(client: redis.Redis, seconds: float = 10.0) -> tuple[float, float]:
    """Commands per second an idle worker costs Redis: (sent by clients, run in all incl. inside scripts)."""
    sent = ran = 0
    deadline = time.monotonic() + seconds
    with client.monitor() as monitor:
        for command in monitor.listen():
            if time.monotonic() > deadline:
                break
            ran += 1
            sent += command.get("client_type") != "lua"
    return sent / seconds, ran / seconds


def stock_dramatiq(n: int, timeout_ms: int, idle_s: float = IDLE_PAUSE_S) -> dict[str, list[float]]:
    """dramatiq's own RedisBroker and polling consumer, one thread, prefetch 1, a no-op actor.

    Its consumer backs off up to `timeout_ms` while idle, so its pickup depends on how long it idled.
    """
    with bench_env("tiny") as settings:
        broker = RedisBroker(url=settings.effective_redis_url, namespace="stock")
        starts: list[float] = []
        started = threading.Event()

        def noop(sent_at: float) -> None:
            starts.append(time.time())
            started.set()

        actor = dramatiq.actor(noop, broker=broker, actor_name="noop", queue_name="stock", max_retries=0)
        worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=timeout_ms)
        worker.queue_prefetch = 1
        worker.start()
        try:
            pickups = []
            for _ in range(n):
                time.sleep(idle_s)
                started.clear()
                sent = time.time()
                actor.send(sent)
                if not started.wait(10):
                    raise TimeoutError("stock dramatiq did not pick up")
                pickups.append(starts[-1] - sent)
            starts.clear()
            worker.pause()
            for _ in range(n):
                actor.send(0.0)
            worker.resume()
            deadline = time.monotonic() + 60
            while len(starts) < n and time.monotonic() < deadline:
                time.sleep(0.01)
            gaps = [b - a for a, b in zip(starts, starts[1:])]
        finally:
            worker.stop()
            broker.close()
    return {"pickup": pickups, "gap": gaps}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--no-celery", action="store_true")
    args = parser.parse_args()
    results = {"onelane": onelane(args.n)}
    if not args.no_celery:
        from bench import celery_baseline

        with bench_env("tiny") as settings:
            results["celery solo"] = celery_baseline.run(settings, args.n)
    results["dramatiq 1000ms"] = stock_dramatiq(min(args.n, 20), 1000, idle_s=1.0)  # idle 1 s between jobs
    results["dramatiq 100ms"] = stock_dramatiq(args.n, 100)

    print(f"\npickup on an idle worker and back-to-back gap, n={args.n}, load average {os.getloadavg()[0]:.2f}")
    base = results.get("celery solo")
    for name, r in results.items():
        line = f"{name:16s} pickup {summary(r['pickup'])}"
        if base and name != "celery solo":
            line += f"  [p50 x{pct(r['pickup'], 50) / pct(base['pickup'], 50):.2f} vs celery]"
        print(line)
        line = f"{'':16s} gap    {summary(r['gap'])}"
        if base and name != "celery solo":
            line += f"  [p50 x{pct(r['gap'], 50) / pct(base['gap'], 50):.2f} vs celery]"
        print(line)
    sent, ran = results["onelane"]["idle_cmds"]
    print(f"onelane idle worker: {sent:.1f} Redis commands/s sent ({ran:.1f}/s run, counting those inside scripts)")
    print("targets: pickup p50 <= 2 ms, p99 <= 10 ms; gap p50 <= 2 ms; idle <= ~5 commands/s")


if __name__ == "__main__":
    main()
