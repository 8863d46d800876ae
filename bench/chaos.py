"""Chaos benchmark: kill the GPU worker at random under a backlog, and overload the real stack over HTTP.

    .venv/bin/python -m bench.chaos [--mode kill|overload|both]

kill      200 jobs admitted through the web app, then the lease holder (the active worker process) is
          SIGKILLed 20 times at random moments. Reports lost jobs (must be 0), jobs generated twice (must be
          0, judged from each job's durable event log and the worker log), requeues, worker_crashed
          failures, worker restarts, and how long generation paused after each kill.
overload  `onelane worker` + `onelane web` as subprocesses; measures the service rate, then submits at 10x
          that rate for 60 s from several client threads. Reports admissions, rejections and their
          Retry-After, waits of admitted jobs, and Redis memory.

Everything runs on loopback (Redis on a unix socket, the web on 127.0.0.1); every process started here is
stopped before the script returns. Every figure printed is measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import redis

from bench.common import bench_env, pct
from tasks import keys
from tasks.settings import Settings
from tasks.store import TERMINAL_EVENTS, Store, connect

MARKER_CHANNEL = "bench-chaos:kill"  # outside onelane's namespace: only this script publishes or reads it
PROMPTS = ["tell me about queues", "a story about a patient robot", "count to ten", "hello there", "why GPUs?"]


# --- processes -------------------------------------------------------------------------------------------


def base_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of `onelane worker` / `onelane web` pointed at the bench's Redis and model."""
    env = {
        **os.environ,
        "REDIS_URL": settings.effective_redis_url,
        "ONELANE_MODEL": settings.model_path,
        "ONELANE_VAR_DIR": str(settings.var_dir),
        "ONELANE_DEVICE": settings.device,
        "PYTHONUNBUFFERED": "1",
    }
    env.update(extra)
    return env


@contextmanager
def process(args: list[str], env: dict[str, str], log_path: Path, stop_timeout_s: float = 45.0) -> Iterator[subprocess.Popen[bytes]]:
    """Start `args` in its own process group with output to `log_path`; always stopped on exit.

    SIGTERM first (the supervisor then stops its workers), then SIGKILL to the group this script created.
    """
    log = open(log_path, "ab")
    child = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield child
    finally:
        try:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(timeout=stop_timeout_s)
                except subprocess.TimeoutExpired:
                    print(f"  ! {args[-1]} (pid {child.pid}) did not stop in {stop_timeout_s:.0f} s: SIGKILL")
            # anything left in the group this script created (a worker orphaned by its supervisor)
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if child.poll() is None:
                child.wait(timeout=10)
        finally:
            log.close()


def pid_dead(pid: int) -> bool:
    """True once `pid` is gone or a zombie (it can no longer run code)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_memory(client: redis.Redis) -> tuple[str, int, int, str]:
    """used_memory_human, used_memory (bytes), number of keys, used_memory_peak_human."""
    info = client.info("memory")
    return str(info["used_memory_human"]), int(info["used_memory"]), int(client.dbsize()), str(info["used_memory_peak_human"])


# --- observers ---------------------------------------------------------------------------------------------


class EventClock(threading.Thread):
    """Subscribes to every job channel (pattern) plus the kill marker and logs arrivals in order.

    Pub/sub delivers in publication order on one connection, so a token logged after a kill's marker was
    published after the killed process was already dead: it came from the worker that took over.
    """

    def __init__(self, client: redis.Redis, limit_s: float) -> None:
        super().__init__(name="event-clock", daemon=True)
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.psubscribe(keys.CHANNEL_PREFIX + "*")
        self.pubsub.subscribe(MARKER_CHANNEL)
        self.limit_s = limit_s
        self.stop = threading.Event()
        self.log: list[tuple[float, str, str]] = []  # (monotonic time, event type or "marker", job id / kill no.)
        self.errors = 0

    def run(self) -> None:
        deadline = time.monotonic() + self.limit_s
        try:
            while not self.stop.is_set() and time.monotonic() < deadline:
                try:
                    message = self.pubsub.get_message(timeout=0.2)
                except redis.RedisError:
                    self.errors += 1
                    if self.errors > 50:
                        return
                    time.sleep(0.05)
                    continue
                if message is None:
                    continue
                now = time.monotonic()
                channel = message["channel"]
                if channel == MARKER_CHANNEL:
                    self.log.append((now, "marker", message["data"]))
                    continue
                try:
                    payload = json.loads(message["data"])
                    self.log.append((now, payload["e"]["type"], channel[len(keys.CHANNEL_PREFIX):]))
                except (ValueError, KeyError, TypeError):
                    self.errors += 1
        finally:
            self.pubsub.close()


class LeaseWatch(threading.Thread):
    """Polls the device lease every 20 ms and logs each change of holder pid (None while nobody holds it)."""

    def __init__(self, store: Store, limit_s: float) -> None:
        super().__init__(name="lease-watch", daemon=True)
        self.store = store
        self.limit_s = limit_s
        self.stop = threading.Event()
        self.changes: list[tuple[float, int | None]] = []

    def run(self) -> None:
        deadline = time.monotonic() + self.limit_s
        last: int | None | str = "unset"
        while not self.stop.wait(0.02) and time.monotonic() < deadline:
            try:
                raw = self.store.redis.hget(keys.device(self.store.settings.device), "pid")
            except redis.RedisError:
                continue
            pid = int(raw) if raw else None
            if pid != last:
                self.changes.append((time.monotonic(), pid))
                last = pid


def wait_for_holder(store: Store, exclude: set[int], timeout_s: float) -> int | None:
    """The pid of a live process holding the device (not one of `exclude`), or None after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            workers = store.snapshot().workers
        except redis.RedisError:
            workers = []
        for w in workers:
            if w.pid and w.pid not in exclude and not pid_dead(w.pid):
                return w.pid
        time.sleep(0.02)
    return None


# --- mode kill ---------------------------------------------------------------------------------------------


COMPLETED_LINE = re.compile(r"job (job_[A-Za-z0-9_-]+): completed \(")
STARTED_LINE = re.compile(r"job (job_[A-Za-z0-9_-]+): started \(")
EXITED_LINE = re.compile(r"^(\S+ \S+) \d+ worker\.supervisor WARNING worker process (\d+) exited", re.M)


def audit_job(store: Store, job_id: str, max_tokens: int) -> dict[str, Any]:
    """What the durable record says about one job; `problems` lists every sign of a double generation."""
    job = store.get(job_id)
    events = store.events(job_id)
    types = [e["type"] for e in events]
    problems: list[str] = []
    terminals = [i for i, t in enumerate(types) if t in TERMINAL_EVENTS]
    if len(terminals) != 1:
        problems.append(f"{len(terminals)} terminal events")
    elif terminals[0] != len(types) - 1:
        problems.append("events after the terminal event")
    starts = [i for i, t in enumerate(types) if t == "started"]
    for prev, cur in zip(starts, starts[1:]):
        if "requeued" not in types[prev:cur]:
            problems.append(f"started again at event {cur} without a requeued in between")
    if starts and any(t == "token" for t in types[: starts[0]]):
        problems.append("tokens before the first started")
    # the last attempt's tokens are the job's output: counts and text agree with the record
    last = starts[-1] if starts else len(types)
    tail = [e for e in events[last:] if e["type"] == "token"]
    n_tail = sum(int(e.get("n", 0)) for e in tail)
    text_tail = "".join(e.get("text", "") for e in tail)
    if job.status.value == "completed":
        if job.usage.completion_tokens != max_tokens:
            problems.append(f"completed with {job.usage.completion_tokens} tokens, asked {max_tokens}")
        # a batch whose text is empty (held back, partial UTF-8) is counted without an event: n may fall short
        if n_tail > job.usage.completion_tokens:
            problems.append(f"token events of the last attempt count {n_tail}, record says {job.usage.completion_tokens}")
        if text_tail != job.output:
            problems.append("output differs from the last attempt's token events")
    requeues = types.count("requeued")
    if job.status.value in ("completed", "failed") and starts and len(starts) != requeues + 1:
        problems.append(f"{len(starts)} starts but {requeues} requeues")
    if job.attempts != len(starts):
        problems.append(f"attempts={job.attempts} but {len(starts)} started events")
    return {
        "status": job.status.value,
        "error": job.error.type if job.error else None,
        "attempts": job.attempts,
        "requeues": requeues,
        "problems": problems,
        "timings": job.timings,
    }


def admit_backlog(settings: Settings, n_jobs: int, max_tokens: int, rng: random.Random) -> tuple[list[str], float, Counter[int]]:
    """POST /v1/jobs n_jobs times through the real Flask app (test client); returns ids, seconds, statuses."""
    from web import create_app

    app = create_app(settings)
    client = app.test_client()
    ids: list[str] = []
    statuses: Counter[int] = Counter()
    started = time.perf_counter()
    for n in range(n_jobs):
        body = {"prompt": f"{rng.choice(PROMPTS)} #{n}", "max_tokens": max_tokens, "ignore_eos": True}
        response = client.post("/v1/jobs", json=body)
        statuses[response.status_code] += 1
        if response.status_code == 202:
            ids.append(response.get_json()["id"])
    return ids, time.perf_counter() - started, statuses


def run_kill(args: argparse.Namespace, max_attempts: int) -> dict[str, Any]:
    rng = random.Random(args.seed)
    print(f"\n=== mode kill: {args.jobs} jobs, {args.kills} kills ({args.kill_order}), "
          f"ONELANE_MAX_ATTEMPTS={max_attempts}, ONELANE_LEASE_S=1, seed {args.seed} ===")  # fmt: skip
    wall = time.monotonic()
    with bench_env("tiny") as base:
        settings = base.model_copy(update={
            "max_queue": args.jobs * 2, "max_queued_per_user": args.jobs * 2, "lease_s": 1.0,
            "max_attempts": max_attempts,
        })  # fmt: skip
        client = connect(settings.effective_redis_url)
        store = Store(client, settings)
        folder = Path(settings.var_dir)
        worker_log = folder / "worker.log"
        env = base_env(settings, ONELANE_LEASE_S="1", ONELANE_MAX_ATTEMPTS=str(max_attempts))
        clock = EventClock(connect(settings.effective_redis_url), limit_s=args.wait_s + 240)
        lease = LeaseWatch(Store(connect(settings.effective_redis_url), settings), limit_s=args.wait_s + 240)
        clock.start()
        lease.start()
        kills: list[dict[str, Any]] = []
        try:
            ids, admit_s, statuses = admit_backlog(settings, args.jobs, args.max_tokens, rng)
            print(f"admitted {len(ids)} of {args.jobs} via POST /v1/jobs in {admit_s:.2f} s "
                  f"(statuses {dict(statuses)}), max_tokens={args.max_tokens}, ignore_eos")  # fmt: skip
            with process([sys.executable, "-m", "tasks.cli", "worker"], env, worker_log) as supervisor:
                t_start = time.monotonic()
                first = wait_for_holder(store, set(), timeout_s=60)
                if first is None:
                    raise RuntimeError(f"no worker took the device in 60 s; see {worker_log}:\n" + tail(worker_log))
                print(f"worker holds the device {time.monotonic() - t_start:.2f} s after `onelane worker` started")
                killed: set[int] = set()
                kill_phase_deadline = time.monotonic() + args.wait_s
                for k in range(args.kills):
                    if time.monotonic() > kill_phase_deadline:
                        print(f"  ! kill phase over its {args.wait_s:.0f} s bound after {k} kills")
                        break
                    waited = time.monotonic()
                    if args.kill_order == "holder-first":
                        # a new holder first, then a random moment of its active life
                        if wait_for_holder(store, killed, timeout_s=60) is None:
                            print(f"  ! kill {k + 1}: no live lease holder within 60 s; stopping the kills")
                            break
                        time.sleep(rng.uniform(0.3, 2.0))
                    else:
                        # a random pause, then whoever holds the device as soon as someone does
                        time.sleep(rng.uniform(0.3, 2.0))
                    pid = wait_for_holder(store, killed, timeout_s=60)
                    if pid is None:
                        print(f"  ! kill {k + 1}: no live lease holder within 60 s; stopping the kills")
                        break
                    lease_job = store.redis.hget(keys.device(settings.device), "job") or ""
                    running = lease_job and store.redis.hget(keys.job(lease_job), "status") == "in_progress"
                    t_kill, wall_kill = time.monotonic(), time.time()
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        continue
                    killed.add(pid)
                    dead_deadline = time.monotonic() + 5
                    while not pid_dead(pid) and time.monotonic() < dead_deadline:
                        time.sleep(0.001)
                    client.publish(MARKER_CHANNEL, str(k))
                    kills.append({"k": k, "pid": pid, "t": t_kill, "wall": wall_kill, "job": lease_job if running else None,
                                  "since_previous_s": t_kill - waited})  # fmt: skip
                    if supervisor.poll() is not None:
                        print(f"  ! the supervisor exited ({supervisor.returncode})")
                        break
                kill_end = time.monotonic()
                # every admitted job must reach a terminal state
                pending = wait_done_store(client, ids, args.wait_s)
                drained = time.monotonic()
                restarts = int(client.hget(keys.STATS, "worker_restarts") or 0)
                stats = client.hgetall(keys.STATS)
                time.sleep(0.3)  # let the last events reach the clock
            clock.stop.set()
            lease.stop.set()
            clock.join(5)
            lease.join(5)
            # ---- analysis (Redis still up; the worker is stopped) ----
            audits = {}
            missing = []
            for job_id in ids:
                if not client.exists(keys.job(job_id)):
                    missing.append(job_id)
                    continue
                audits[job_id] = audit_job(store, job_id, args.max_tokens)
            log_text = worker_log.read_text(errors="replace")
            completed_lines = Counter(COMPLETED_LINE.findall(log_text))
            started_lines = Counter(STARTED_LINE.findall(log_text))
            if args.keep_logs:
                Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
                shutil.copy(worker_log, Path(args.keep_logs) / f"kill-attempts{max_attempts}-worker.log")
            return report_kill(args, max_attempts, ids, audits, missing, completed_lines, started_lines, kills,
                               clock, lease, restarts, stats, t_start, kill_end, drained, pending, wall, log_text)  # fmt: skip
        finally:
            clock.stop.set()
            lease.stop.set()
            clock.join(5)
            lease.join(5)
            client.close()


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def report_kill(args, max_attempts, ids, audits, missing, completed_lines, started_lines, kills, clock, lease,  # type: ignore[no-untyped-def]
                restarts, stats, t_start, kill_end, drained, pending, wall, log_text) -> dict[str, Any]:
    by_status = Counter(a["status"] for a in audits.values())
    not_terminal = [j for j, a in audits.items() if a["status"] not in TERMINAL_EVENTS]
    lost = len(missing) + len(not_terminal)
    twice_events = {j: a["problems"] for j, a in audits.items() if a["problems"]}
    twice_log = {j: c for j, c in completed_lines.items() if c > 1}
    completed_ids = {j for j, a in audits.items() if a["status"] == "completed"}
    log_mismatch = completed_ids ^ (set(completed_lines) & set(ids))
    twice = set(twice_events) | set(twice_log)
    requeued_jobs = sum(1 for a in audits.values() if a["requeues"] > 0)
    requeue_events = sum(a["requeues"] for a in audits.values())
    crashed = sum(1 for a in audits.values() if a["status"] == "failed" and a["error"] == "worker_crashed")
    attempts_hist = Counter(a["attempts"] for a in audits.values())
    hit_twice = sum(1 for a in audits.values() if a["attempts"] >= 2 and (a["requeues"] >= 2 or
                    (a["requeues"] >= 1 and a["status"] == "failed")))  # fmt: skip

    # kill -> next token (a token that arrived after the kill's marker, i.e. from the next worker)
    marker_at = {int(job): n for n, (_, kind, job) in enumerate(clock.log) if kind == "marker"}
    gaps, holder_gaps, no_token = [], [], 0
    for kill in kills:
        index = marker_at.get(kill["k"])
        nxt = None
        if index is not None:
            nxt = next((t for t, kind, _ in clock.log[index + 1:] if kind == "token"), None)
        if nxt is None:
            no_token += 1
        else:
            kill["gap"] = nxt - kill["t"]
            gaps.append(kill["gap"])
        took = next((t for t, pid in lease.changes if t > kill["t"] and pid not in (None, kill["pid"])), None)
        if took is not None:
            kill["holder_gap"] = took - kill["t"]
            holder_gaps.append(kill["holder_gap"])
    # recovery proper: kills whose next token came before the next kill
    clean = [a["gap"] for a, b in zip(kills, kills[1:] + [None]) if "gap" in a and (b is None or a["t"] + a["gap"] < b["t"])]
    # how long the supervisor took to notice each death (its log line "worker process P exited")
    exits = {}
    for stamp, pid in EXITED_LINE.findall(log_text):
        try:
            exits[int(pid)] = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
    noticed = [exits[k["pid"]] - k["wall"] for k in kills if k["pid"] in exits]
    waits = [a["timings"].started_at - a["timings"].queued_at for a in audits.values() if a["timings"].started_at]

    print(f"jobs admitted:                 {len(ids)}")
    print(f"reached a terminal state:      {sum(by_status[s] for s in TERMINAL_EVENTS)}  "
          f"({', '.join(f'{s} {c}' for s, c in sorted(by_status.items()))})")  # fmt: skip
    print(f"LOST (not terminal/missing):   {lost}   (missing {len(missing)}, not terminal {len(not_terminal)})")
    print(f"GENERATED TWICE:               {len(twice)}")
    print("  definition: from each job's durable event log (store.events): exactly one terminal event and it is")
    print("  the last; every `started` after the first preceded by a `requeued`; starts = requeues + 1;")
    print("  attempts = number of starts; a completed job has completion tokens = max_tokens, its output = the")
    print("  text of its last attempt's token events, and those events count no more than max_tokens (n summed);")
    print("  plus the worker log: no job id logged 'completed' more than once, and the same set of ids completed.")
    print(f"  event-log violations: {len(twice_events)};  ids 'completed' >1x in the worker log: {len(twice_log)};"
          f"  completed in Redis vs worker log mismatches: {len(log_mismatch)}")  # fmt: skip
    for j, problems in list(twice_events.items())[:5]:
        print(f"    {j}: {problems}")
    for j, c in list(twice_log.items())[:5]:
        print(f"    {j}: completed {c} times in the worker log")
    print(f"jobs requeued (>=1 requeue):   {requeued_jobs}   (requeued events {requeue_events}, "
          f"stats requeued {stats.get('requeued', 0)})")  # fmt: skip
    print(f"failed worker_crashed:         {crashed}")
    print(f"jobs hit by >=2 kills:         {hit_twice}   (attempts per job: "
          f"{', '.join(f'{a}x{c}' for a, c in sorted(attempts_hist.items()))})")  # fmt: skip
    print(f"started lines in worker log:   {sum(started_lines.values())} for {len(started_lines)} jobs")
    print(f"kills done:                    {len(kills)} of {args.kills} "
          f"({sum(1 for k in kills if k['job'])} while a job was running, the rest while loading/idle)")  # fmt: skip
    print(f"worker restarts (stats):       {restarts}")
    if gaps:
        print(f"kill -> next token:            longest {max(gaps):.2f} s, median {statistics.median(gaps):.2f} s, "
              f"shortest {min(gaps):.2f} s (n={len(gaps)}; {no_token} kills never followed by a token)")  # fmt: skip
    else:
        print(f"kill -> next token:            no token followed any kill ({no_token} kills)")
    if clean:
        print(f"  of which the next token came before the next kill: longest {max(clean):.2f} s, "
              f"median {statistics.median(clean):.2f} s (n={len(clean)})")  # fmt: skip
    if holder_gaps:
        print(f"kill -> new lease holder:      longest {max(holder_gaps):.2f} s, "
              f"median {statistics.median(holder_gaps):.2f} s (n={len(holder_gaps)})")  # fmt: skip
    if noticed:
        print(f"kill -> supervisor logs the exit: longest {max(noticed):.2f} s, median {statistics.median(noticed):.2f} s "
              f"(n={len(noticed)}; log timestamps have ms resolution)")  # fmt: skip
    if waits:
        print(f"queue wait (started-queued):   p50 {pct(waits, 50):.2f} s, max {max(waits):.2f} s")
    print("per kill: #, wall clock, pid, what it was doing, s to a new holder, s to the next token:")
    for k in kills:
        print(f"  #{k['k'] + 1:<2} {datetime.fromtimestamp(k['wall']).strftime('%H:%M:%S.%f')[:-3]} pid {k['pid']:<6} "
              f"{'running a job' if k['job'] else 'no job yet  '}  holder {k.get('holder_gap', float('nan')):6.2f}  "
              f"token {k.get('gap', float('nan')):6.2f}")  # fmt: skip
    print(f"timeline: kills over {kill_end - t_start:.1f} s, all terminal after {drained - t_start:.1f} s "
          f"({len(pending)} still pending), whole run {time.monotonic() - wall:.1f} s")  # fmt: skip
    if clock.errors:
        print(f"  ! listener errors: {clock.errors}")
    return {"lost": lost, "twice": len(twice), "crashed": crashed, "hit_twice": hit_twice, "attempts": max_attempts}


# --- mode overload -----------------------------------------------------------------------------------------


def run_overload(args: argparse.Namespace) -> dict[str, Any]:
    import requests

    print(f"\n=== mode overload: ONELANE_MAX_QUEUE={args.max_queue}, ONELANE_MAX_QUEUED_PER_USER={args.max_queue}, "
          f"{args.seconds:.0f} s at {args.factor:g}x the service rate, {args.clients} client threads ===")  # fmt: skip
    wall = time.monotonic()
    with bench_env("tiny") as settings:
        folder = Path(settings.var_dir)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        env = base_env(settings, ONELANE_LEASE_S="1", ONELANE_MAX_ATTEMPTS="3",
                       ONELANE_MAX_QUEUE=str(args.max_queue), ONELANE_MAX_QUEUED_PER_USER=str(args.max_queue))  # fmt: skip
        client = connect(settings.effective_redis_url)
        store = Store(client, settings)
        body = {"prompt": "overload", "max_tokens": args.max_tokens, "ignore_eos": True}
        try:
            with (
                process([sys.executable, "-m", "tasks.cli", "worker"], env, folder / "worker.log") as worker,
                process([sys.executable, "-m", "tasks.cli", "web", "--port", str(port)], env, folder / "web.log") as web,
                requests.Session() as http,
            ):
                deadline = time.monotonic() + 60
                up = False
                while time.monotonic() < deadline and not up:
                    try:
                        up = http.get(f"{base}/healthz", timeout=2).status_code == 200
                    except requests.RequestException:
                        time.sleep(0.1)
                if not up or wait_for_holder(store, set(), max(1.0, deadline - time.monotonic())) is None:
                    raise RuntimeError("the stack did not come up in 60 s:\n" + tail(folder / "web.log") + "\n"
                                       + tail(folder / "worker.log"))  # fmt: skip
                # warm-up: the first job pays for the model load
                warm = http.post(f"{base}/v1/jobs", json=body, timeout=10).json()["id"]
                wait_done_http(http, base, [warm], 60)
                # service rate: jobs one after another, each submitted when the previous ended
                started = time.perf_counter()
                seq = []
                for _ in range(args.rate_jobs):
                    job_id = http.post(f"{base}/v1/jobs", json=body, timeout=10).json()["id"]
                    wait_done_http(http, base, [job_id], 30)
                    seq.append(job_id)
                seq_s = time.perf_counter() - started
                rate = args.rate_jobs / seq_s
                service = [
                    (j["timings"]["finished_at"] - j["timings"]["started_at"])
                    for j in (http.get(f"{base}/v1/jobs/{i}", timeout=10).json() for i in seq)
                ]
                print(f"service rate: {args.rate_jobs} jobs one after another in {seq_s:.2f} s = {rate:.2f} jobs/s "
                      f"(generation alone: median {statistics.median(service) * 1000:.0f} ms/job, "
                      f"{args.max_tokens} tokens)")  # fmt: skip
                target = rate * args.factor
                mem_before = redis_memory(client)
                result = flood(base, body, target, args.seconds, args.clients)
                mem_after = redis_memory(client)
                accepted = result["accepted"]
                # every accepted job must end; bounded
                unfinished = wait_done_store(client, accepted, args.drain_s)
                time.sleep(0.5)
                mem_done = redis_memory(client)
                jobs = [http.get(f"{base}/v1/jobs/{i}", timeout=10).json() for i in accepted]
                finished_at = max((j["timings"]["finished_at"] or 0) for j in jobs) if jobs else 0
                first_q = min((j["timings"]["queued_at"] for j in jobs), default=0)
                alive = worker.poll() is None and web.poll() is None
            report_overload(args, rate, target, result, jobs, unfinished, mem_before, mem_after, mem_done,
                            finished_at - first_q, alive, wall)  # fmt: skip
            if args.keep_logs:
                Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
                for name in ("worker.log", "web.log"):
                    shutil.copy(folder / name, Path(args.keep_logs) / f"overload-{name}")
            return result
        finally:
            client.close()


def wait_done_http(http, base: str, ids: list[str], timeout_s: float) -> list[str]:  # type: ignore[no-untyped-def]
    """Poll GET /v1/jobs/<id> until every job is terminal; returns the ids still not terminal at the timeout."""
    pending = list(ids)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        pending = [j for j in pending if http.get(f"{base}/v1/jobs/{j}", timeout=10).json()["status"] not in TERMINAL_EVENTS]
        if pending:
            time.sleep(0.01)
    return pending


def wait_done_store(client: redis.Redis, ids: list[str], timeout_s: float) -> list[str]:
    """Read the jobs' status from Redis (one pipeline a round) until all are terminal; returns the rest."""
    pending = list(ids)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        pipe = client.pipeline(transaction=False)
        for job_id in pending:
            pipe.hget(keys.job(job_id), "status")
        pending = [j for j, s in zip(pending, pipe.execute()) if s not in TERMINAL_EVENTS]
        if pending:
            time.sleep(0.1)
    return pending


def flood(base: str, body: dict[str, Any], rate: float, seconds: float, clients: int) -> dict[str, Any]:
    """Submit at `rate` jobs/s for `seconds` from `clients` threads, on an open-loop schedule (bounded)."""
    import requests

    total = int(rate * seconds)
    lock = threading.Lock()
    next_ticket = [0]
    out: dict[str, Any] = {"accepted": [], "status": Counter(), "types": Counter(), "retry_after": [],
                           "retry_missing": 0, "retry_bad": [], "errors": Counter(), "latency": []}  # fmt: skip
    t0 = time.monotonic() + 0.2
    hard_stop = t0 + seconds + 15

    def client() -> None:
        with requests.Session() as http:
            while True:
                with lock:
                    ticket = next_ticket[0]
                    next_ticket[0] += 1
                if ticket >= total or time.monotonic() > hard_stop:
                    return
                delay = t0 + ticket / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                sent = time.monotonic()
                try:
                    response = http.post(f"{base}/v1/jobs", json=body, timeout=10)
                except requests.RequestException as exc:
                    with lock:
                        out["errors"][type(exc).__name__] += 1
                    continue
                took = time.monotonic() - sent
                kind = None
                try:
                    payload = response.json()
                    kind = payload.get("error", {}).get("type") if response.status_code != 202 else None
                except ValueError:
                    payload = {}
                with lock:
                    out["latency"].append(took)
                    out["status"][response.status_code] += 1
                    if response.status_code == 202:
                        out["accepted"].append(payload["id"])
                        continue
                    out["types"][f"{response.status_code} {kind}"] += 1
                    value = response.headers.get("Retry-After")
                    if value is None:
                        out["retry_missing"] += 1
                    elif not value.isdigit() or int(value) <= 0:
                        out["retry_bad"].append(value)
                    else:
                        out["retry_after"].append(int(value))

    threads = [threading.Thread(target=client, name=f"client-{n}", daemon=True) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.1, hard_stop + 12 - time.monotonic()))
    out["elapsed"] = time.monotonic() - t0
    out["stuck_threads"] = sum(1 for t in threads if t.is_alive())
    out["planned"] = total
    return out


def report_overload(args, rate, target, result, jobs, unfinished, mem_before, mem_after, mem_done, busy_s,  # type: ignore[no-untyped-def]
                    alive, wall) -> None:
    submitted = sum(result["status"].values())
    rejected = submitted - len(result["accepted"])
    print(f"target {target:.1f} jobs/s for {args.seconds:.0f} s = {result['planned']} planned; "
          f"sent in {result['elapsed']:.1f} s = {submitted / max(result['elapsed'], 1e-9):.1f} req/s achieved")  # fmt: skip
    print(f"submitted:        {submitted}  (+ {sum(result['errors'].values())} transport errors "
          f"{dict(result['errors'])})")  # fmt: skip
    print(f"accepted (202):   {len(result['accepted'])}")
    print(f"rejected:         {rejected}  by status/type: "
          f"{', '.join(f'{k}: {v}' for k, v in sorted(result['types'].items())) or '-'}")  # fmt: skip
    ra = result["retry_after"]
    print(f"Retry-After:      {len(ra)} of {rejected} rejections carry a positive integer; missing {result['retry_missing']}, "
          f"malformed {len(result['retry_bad'])} {result['retry_bad'][:5]}"
          + (f"; values min {min(ra)} / median {statistics.median(ra):g} / max {max(ra)} s" if ra else ""))  # fmt: skip
    lat = result["latency"]
    if lat:
        print(f"POST latency:     p50 {pct(lat, 50) * 1000:.1f} ms, p99 {pct(lat, 99) * 1000:.1f} ms, "
              f"max {max(lat) * 1000:.1f} ms")  # fmt: skip
    statuses = Counter(j["status"] for j in jobs)
    waits = [j["timings"]["started_at"] - j["timings"]["queued_at"] for j in jobs if j["timings"]["started_at"]]
    print(f"accepted jobs ended: {dict(statuses)}; not terminal at the end: {len(unfinished)}")
    if waits:
        print(f"wait of accepted jobs (started_at - queued_at): longest {max(waits):.2f} s, "
              f"p50 {pct(waits, 50):.2f} s, p99 {pct(waits, 99):.2f} s (n={len(waits)})")  # fmt: skip
        completed = sum(1 for j in jobs if j["status"] == "completed")
        print(f"throughput under load: {completed} jobs completed in {busy_s:.1f} s = {completed / max(busy_s, 1e-9):.2f} "
              f"jobs/s (sequential estimate was {rate:.2f} jobs/s)")  # fmt: skip
    print("Redis memory (INFO memory used_memory):")
    for label, m in (("before the flood", mem_before), ("after the flood", mem_after),
                     ("after all jobs finished", mem_done)):  # fmt: skip
        print(f"  {label:<24} {m[0]:>8} ({m[1]} B), {m[2]} keys, peak so far {m[3]}")
    print("  (an ended job and its output are kept for ONELANE_RESULT_TTL, so the last figure still holds every job of the run)")
    print(f"worker and web still running at the end: {alive}; stuck client threads: {result['stuck_threads']}; "
          f"whole run {time.monotonic() - wall:.1f} s")  # fmt: skip


# --- main --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["kill", "overload", "both"], default="kill")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=60)
    parser.add_argument("--attempts", type=int, nargs="+", default=[3],
                        help="ONELANE_MAX_ATTEMPTS for the kill runs, one run each (e.g. --attempts 3 2)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--kill-order", choices=["holder-first", "wait-first"], default="holder-first",
                        help="holder-first: wait for a new lease holder, then 0.3-2.0 s, then kill it; wait-first: "
                        "wait 0.3-2.0 s, then kill the holder as soon as there is one (often while it starts up)")
    parser.add_argument("--wait-s", type=float, default=180.0, help="bound on the kill phase and on the drain")
    parser.add_argument("--seconds", type=float, default=60.0, help="overload: how long to flood")
    parser.add_argument("--factor", type=float, default=10.0, help="overload: multiple of the service rate")
    parser.add_argument("--clients", type=int, default=8, help="overload: client threads")
    parser.add_argument("--max-queue", type=int, default=64, help="overload: ONELANE_MAX_QUEUE and per-user bound")
    parser.add_argument("--rate-jobs", type=int, default=20, help="overload: jobs timed one after another")
    parser.add_argument("--drain-s", type=float, default=120.0, help="overload: bound on waiting for accepted jobs")
    parser.add_argument("--keep-logs", default=None, help="copy the worker/web logs into this folder")
    args = parser.parse_args(argv)
    for name in ("jobs", "kills", "max_tokens", "clients", "max_queue", "rate_jobs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")

    failures = []
    if args.mode in ("kill", "both"):
        print("Why ONELANE_MAX_ATTEMPTS=3: a job is requeued each time its worker dies, up to MAX_ATTEMPTS runs,")
        print("then it ends failed `worker_crashed` (quarantine for a prompt that kills the worker). With "
              f"{args.kills} random")
        print(f"kills among {args.jobs} jobs, a requeued job runs first on the next worker, so a second kill soon after")
        print("the first can hit the same job again: with the default 2 that job ends failed worker_crashed although")
        print("it crashed nothing itself (not lost, but a spurious failure); 3 tolerates one such double hit.")
        print("Run with --attempts 3 2 to see both.")
        for attempts in args.attempts:
            summary = run_kill(args, attempts)
            if summary["lost"] or summary["twice"]:
                failures.append(f"kill (MAX_ATTEMPTS={attempts}): lost {summary['lost']}, twice {summary['twice']}")
    if args.mode in ("overload", "both"):
        run_overload(args)
    if failures:
        print("\nFAILED: " + "; ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
