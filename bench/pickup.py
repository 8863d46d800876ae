"""Pickup latency and the gap between back-to-back jobs: onelane vs Celery (solo) vs stock dramatiq.

All three run in this one process's run, on the same machine and a private Redis each:
- onelane: a real worker process (`python -m worker.main`), jobs admitted the way the web admits them
  (store.admit with the job's dramatiq message); pickup = started_at - queued_at, both stamped by Redis's
  clock at the admission and the claim; the gap = next started_at - previous finished_at in a drained
  backlog, with ONELANE_MAX_BATCH=1 (one job at a time, as the baselines run: in a batch, jobs overlap). The bench waits for each job's end on its pub/sub channel (no polling to take CPU meanwhile).
- Celery 5, solo pool, prefetch 1 (bench/celery_app.py, as bench/celery_baseline.py runs it): pickup = task
  start - send; the gap is start-to-start of no-op tasks.
- stock dramatiq (its RedisBroker, polling consumer), one thread, prefetch 1, at its default 1000 ms
  worker timeout and at 100 ms: the same no-op body as Celery's.
Also the Redis commands per second an idle onelane worker costs (INFO total_commands_processed).
Run: ./dev.sh bench pickup [--n 200]
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from bench.harness import admit, bench_env, onelane_worker, poll_until, private_redis, wait_ended
from bench.report import pct, summary
from tasks import keys
from tasks.broker import QUEUE_NAME
from tasks.events import Event
from tasks.job import new_job_id
from tasks.store import Store
from worker.main import IDLE_WAIT_MS

IDLE_PAUSE_S = 0.05  # between pickup samples, so the worker is idle (blocked) each time


def admit_noop(store: Store, broker: RedisBroker, max_tokens: int = 1, job_id: str | None = None) -> str:
    """The web's admission path (the job and its message in one script), for a job of `max_tokens` tokens."""
    return admit(store, broker, "bench", "x", job_id=job_id, max_tokens=max_tokens, ignore_eos=True)


def admit_and_wait(store: Store, broker: RedisBroker, timeout_s: float = 60) -> str:
    """Admit one job and block (on its channel, subscribed first) until it ends."""
    job_id = new_job_id()
    deadline = time.monotonic() + timeout_s
    with store.redis.pubsub() as sub:
        sub.subscribe(keys.channel(job_id))
        while (message := sub.get_message(timeout=timeout_s)) is None or message["type"] != "subscribe":
            pass
        admit_noop(store, broker, job_id=job_id)
        while (left := deadline - time.monotonic()) > 0:
            message = sub.get_message(timeout=left)
            if message is not None and Event.from_message(message["data"]).terminal:
                return job_id
    raise TimeoutError(f"job {job_id} did not end")


def onelane(n: int) -> dict[str, list[float]]:
    from tasks.broker import make_broker

    with bench_env("tiny", max_queue=10_000, max_queued_per_user=10_000) as settings:
        store = Store.connect(settings)
        broker = make_broker(settings)
        with onelane_worker(settings, settings.var_dir / "worker.log", supervised=False, ONELANE_MAX_BATCH="1"):
            admit_and_wait(store, broker)  # the worker is up and warm
            pickups = []
            for _ in range(n):
                time.sleep(IDLE_PAUSE_S)
                job_id = admit_and_wait(store, broker)
                t = store.get(job_id).timings
                pickups.append(t.started_at - t.queued_at)  # type: ignore[operator]

            blocker = admit_noop(store, broker, max_tokens=100_000)
            poll_until(lambda: store.get(blocker).timings.started_at, 60, every_s=0.001)
            backlog = [admit_noop(store, broker) for _ in range(n)]
            store.cancel(blocker, "bench")
            if wait_ended(store, backlog, 60 + n, every_s=0.1):
                raise TimeoutError("the backlog did not end")
            timings = sorted((store.get(j).timings for j in backlog), key=lambda t: t.started_at or 0)
            gaps = [b.started_at - a.finished_at for a, b in zip(timings, timings[1:])]  # type: ignore[operator]

            # every admitted job rang its doorbell: let the worker drop those of jobs already run, then idle
            doorbells = keys.dramatiq_queue(broker.namespace, QUEUE_NAME)
            poll_until(lambda: not store.redis.llen(doorbells), 60)
            time.sleep(IDLE_WAIT_MS / 1000)
            idle = idle_commands_per_s(store.redis)
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
    with private_redis() as (_, url):
        broker = RedisBroker(url=url, namespace="stock")
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
        from bench import celery_app

        with private_redis() as (_, url):
            results["celery solo"] = celery_app.run(url, args.n)
    results["dramatiq 1000ms"] = stock_dramatiq(min(args.n, 20), 1000, idle_s=1.0)  # idle 1 s between jobs
    results["dramatiq 100ms"] = stock_dramatiq(args.n, 100)

    print(f"\npickup on an idle worker and back-to-back gap, n={args.n}, load average {os.getloadavg()[0]:.2f}")
    base = results.get("celery solo")
    for name, r in results.items():
        for figure, label in (("pickup", name), ("gap", "")):
            line = f"{label:16s} {figure:6s} {summary(r[figure])}"
            if base and name != "celery solo":
                line += f"  [p50 x{pct(r[figure], 50) / pct(base[figure], 50):.2f} vs celery]"
            print(line)
    sent, ran = results["onelane"]["idle_cmds"]
    print(f"onelane idle worker: {sent:.1f} Redis commands/s sent ({ran:.1f}/s run, counting those inside scripts)")
    print("targets: pickup p50 <= 2 ms, p99 <= 10 ms; gap p50 <= 2 ms; idle <= ~5 commands/s")


if __name__ == "__main__":
    main()
