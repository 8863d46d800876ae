"""Chaos benchmark: kill the GPU worker at random under a backlog, and overload the real stack over HTTP.

    .venv/bin/python -m bench.chaos [--mode kill|overload|both]

kill      a backlog of 200 jobs admitted through the web app, served by `onelane worker` (supervised), whose
          lease holder (the active worker process) is SIGKILLed 20 times at random moments. Reports lost
          jobs (must be 0), jobs generated twice (must be 0; judged from each job's durable event log and the
          worker log), requeues, worker_crashed failures, worker restarts, and how long generation paused
          after each kill.
overload  `onelane worker` and `onelane web` as subprocesses; measures the service rate, then submits at 10x
          that rate for 60 s from several client threads. Reports admissions, rejections and their
          Retry-After, the waits of admitted jobs, and Redis memory.

Loopback only (Redis on a unix socket, the web on 127.0.0.1); every loop is bounded; every process started
here is stopped before the script returns. Every figure printed is measured in this run.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import redis
from flask import Flask

from bench.harness import bench_env, onelane_stack, onelane_worker, poll_until, queue_bounds, tail, wait_ended
from bench.proc import pid_dead
from bench.report import median, pct
from tasks import keys
from tasks.events import TERMINAL, Event, EventType
from tasks.settings import Settings
from tasks.store import Store
from web import create_app
from web.services import EXTENSION

MARKER_CHANNEL = "bench-chaos:kill"  # outside onelane's namespace: only this script publishes or reads it
PROMPTS = ["tell me about queues", "a story about a patient robot", "count to ten", "hello there", "why GPUs?"]


# --- processes ---------------------------------------------------------------------------------------------


def keep_log(args: argparse.Namespace, path: Path, name: str) -> None:
    if args.keep_logs:
        Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(args.keep_logs) / name)


def wait_for_holder(store: Store, exclude: set[int], timeout_s: float) -> int | None:
    """The pid of a live process holding the device (not one of `exclude`), or None after `timeout_s`."""

    def holder() -> int | None:
        try:
            workers = store.readings.snapshot().workers
        except redis.RedisError:
            return None
        return next((w.pid for w in workers if w.pid and w.pid not in exclude and not pid_dead(w.pid)), None)

    return poll_until(holder, timeout_s, every_s=0.02)


# --- observers ---------------------------------------------------------------------------------------------


class EventClock(threading.Thread):
    """Subscribed to every job's channel (a pattern) and to the kill marker; logs each arrival in order.

    Redis delivers one connection's messages in publication order, and a kill's marker is published once the
    killed process is dead, so a job's `started` logged after the marker comes from a worker that took over.
    """

    def __init__(self, client: redis.Redis, limit_s: float) -> None:
        super().__init__(name="event-clock", daemon=True)
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.psubscribe(keys.CHANNEL_PREFIX + "*")
        self.pubsub.subscribe(MARKER_CHANNEL)
        self.limit_s = limit_s
        self.stop = threading.Event()
        self.log: list[tuple[float, str, str]] = []  # (monotonic time, event type or "marker", job id or kill no.)
        self.errors = 0

    def run(self) -> None:
        deadline = time.monotonic() + self.limit_s
        try:
            while not self.stop.is_set() and time.monotonic() < deadline and self.errors < 50:
                try:
                    message = self.pubsub.get_message(timeout=0.2)
                except redis.RedisError:
                    self.errors += 1
                    time.sleep(0.05)
                    continue
                if message is None:
                    continue
                now = time.monotonic()
                if message["channel"] == MARKER_CHANNEL:
                    self.log.append((now, "marker", message["data"]))
                    continue
                try:
                    kind = Event.from_message(message["data"]).type.value
                except (ValueError, KeyError, TypeError):
                    self.errors += 1
                    continue
                self.log.append((now, kind, message["channel"][len(keys.CHANNEL_PREFIX) :]))
        finally:
            self.pubsub.close()

    def next_token_after(self, kill_no: int) -> float | None:
        """When the first token of a job (re)started after kill `kill_no`'s marker arrived."""
        index = next((n for n, (_, kind, k) in enumerate(self.log) if kind == "marker" and k == str(kill_no)), None)
        if index is None:
            return None
        fresh: set[str] = set()
        for t, kind, job in self.log[index + 1 :]:
            if kind == "started":
                fresh.add(job)
            elif kind == "token" and job in fresh:
                return t
        return None


class LeaseWatch(threading.Thread):
    """Polls the device lease every 20 ms and logs each change of holder pid (None while nobody holds it)."""

    def __init__(self, client: redis.Redis, device: str, limit_s: float) -> None:
        super().__init__(name="lease-watch", daemon=True)
        self.client = client
        self.key = keys.device(device)
        self.limit_s = limit_s
        self.stop = threading.Event()
        self.changes: list[tuple[float, int | None]] = []

    def run(self) -> None:
        deadline = time.monotonic() + self.limit_s
        last: int | None | str = "unset"
        while not self.stop.wait(0.02) and time.monotonic() < deadline:
            try:
                raw = self.client.hget(self.key, "pid")
            except redis.RedisError:
                continue
            pid = int(raw) if raw else None
            if pid != last:
                self.changes.append((time.monotonic(), pid))
                last = pid

    def next_holder_after(self, t: float, killed_pid: int) -> float | None:
        return next((at for at, pid in self.changes if at > t and pid not in (None, killed_pid)), None)


# --- mode kill ---------------------------------------------------------------------------------------------

COMPLETED_LINE = re.compile(r"job (job_[A-Za-z0-9_-]+): completed \(")
STARTED_LINE = re.compile(r"job (job_[A-Za-z0-9_-]+): started \(")
EXITED_LINE = re.compile(r"^(\S+ \S+) \d+ worker\.supervisor WARNING worker process (\d+) exited", re.M)


@dataclass
class Kill:
    no: int
    pid: int
    t: float  # monotonic, when SIGKILL was sent
    wall: float  # time.time() of the same moment, to match the worker log
    job: str | None  # the job it was running, if any
    holder_s: float | None = None  # until another process held the device
    token_s: float | None = None  # until the next token of a job started after the kill


@dataclass
class KillRun:
    ids: list[str]
    kills: list[Kill] = field(default_factory=list)
    audits: dict[str, dict[str, Any]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    stats: dict[str, str] = field(default_factory=dict)
    log_text: str = ""
    t_start: float = 0.0
    kill_end: float = 0.0
    drained: float = 0.0


def audit_job(store: Store, job_id: str, max_tokens: int) -> dict[str, Any]:
    """What the durable record says about one job; `problems` lists every sign of a double generation."""
    job = store.get(job_id)
    events = store.events(job_id)
    types = [e.type for e in events]
    problems: list[str] = []
    terminals = [e.index for e in events if e.terminal]  # none: not ended, counted as lost
    if len(terminals) > 1:
        problems.append(f"{len(terminals)} terminal events")
    elif terminals and terminals[0] != len(types) - 1:
        problems.append("events after the terminal event")
    starts = [e.index for e in events if e.type is EventType.STARTED]
    for prev, cur in zip(starts, starts[1:]):
        if EventType.REQUEUED not in types[prev:cur]:
            problems.append(f"started again (event {cur}) without a requeued since the last start")
    if EventType.TOKEN in types[: starts[0] if starts else len(types)]:
        problems.append("tokens before the first start")
    requeues = types.count(EventType.REQUEUED)
    if job.status.value in ("completed", "failed") and len(starts) != requeues + 1:
        problems.append(f"{len(starts)} starts but {requeues} requeues")
    if job.attempts != len(starts):
        problems.append(f"attempts={job.attempts} but {len(starts)} started events")
    # an attempt after a requeue goes on from the tokens before it: all attempts together generate at most
    # max_tokens, and their token events, in order, are the output (none repeated). A batch whose text is empty
    # (held back, partial UTF-8) is counted in the record without an event, so n may fall short.
    n = sum(e.n for e in events if e.type is EventType.TOKEN)
    if n > max_tokens:
        problems.append(f"its attempts produced {n} tokens, more than max_tokens {max_tokens}")
    if job.status.value == "completed":
        if job.usage.completion_tokens != max_tokens:
            problems.append(f"completed with {job.usage.completion_tokens} tokens, asked {max_tokens}")
        if "".join(e.text for e in events if e.type is EventType.TOKEN) != job.output:
            problems.append("output differs from its token events")
    return {
        "status": job.status.value,
        "error": job.error.type if job.error else None,
        "attempts": job.attempts,
        "requeues": requeues,
        "problems": problems,
        "wait": (job.timings.started_at - job.timings.queued_at) if job.timings.started_at else None,
    }


def admit_backlog(app: Flask, n_jobs: int, max_tokens: int, rng: random.Random) -> list[str]:
    """POST /v1/jobs n_jobs times through the real Flask app (its test client); returns the admitted ids."""
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
    print(
        f"admitted {len(ids)} of {n_jobs} via POST /v1/jobs in {time.perf_counter() - started:.2f} s "
        f"(statuses {dict(statuses)}), max_tokens={max_tokens}, ignore_eos"
    )
    return ids


def kill_holders(
    args: argparse.Namespace, store: Store, supervisor: subprocess.Popen[bytes], rng: random.Random, run: KillRun
) -> None:
    """SIGKILL the lease holder args.kills times at random moments (bounded by args.wait_s overall)."""
    killed: set[int] = set()
    deadline = time.monotonic() + args.wait_s
    for no in range(args.kills):
        if time.monotonic() > deadline:
            print(f"  ! the kill phase hit its {args.wait_s:.0f} s bound after {no} kills")
            return
        # holder-first: a new holder first, then a random moment of its active life
        if args.kill_order == "holder-first" and wait_for_holder(store, killed, timeout_s=60) is None:
            print(f"  ! kill {no + 1}: nobody took the device within 60 s; no more kills")
            return
        time.sleep(rng.uniform(0.3, 2.0))
        pid = wait_for_holder(store, killed, timeout_s=60)
        if pid is None:
            print(f"  ! kill {no + 1}: nobody took the device within 60 s; no more kills")
            return
        holding = [w for w in store.readings.snapshot().workers if w.pid == pid]
        job = holding[0].jobs[0] if holding and holding[0].jobs else None
        t, wall = time.monotonic(), time.time()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed.add(pid)
        dead_by = time.monotonic() + 5
        while not pid_dead(pid) and time.monotonic() < dead_by:
            time.sleep(0.001)
        store.redis.publish(MARKER_CHANNEL, str(no))  # after the death: see EventClock
        run.kills.append(Kill(no, pid, t, wall, job))
        if supervisor.poll() is not None:
            print(f"  ! `onelane worker` exited ({supervisor.returncode}); no more kills")
            return


def run_kill(args: argparse.Namespace, max_attempts: int) -> dict[str, int]:
    """A fresh stack with the backlog admitted and the observers listening; the kills and the drain; the audit."""
    rng = random.Random(args.seed)
    print(
        f"\n=== mode kill: {args.jobs} jobs, {args.kills} kills ({args.kill_order}), "
        f"ONELANE_MAX_ATTEMPTS={max_attempts}, ONELANE_LEASE_S=1, seed {args.seed} ==="
    )
    wall = time.monotonic()
    with bench_env(
        "tiny", max_queue=args.jobs * 2, max_queued_per_user=args.jobs * 2, lease_s=1.0, max_attempts=max_attempts
    ) as settings:
        store = Store.connect(settings)
        worker_log = Path(settings.var_dir) / "worker.log"
        with observers(store, settings.device, 2 * args.wait_s + 180) as (clock, lease), web_app(settings) as app:
            run = KillRun(ids=admit_backlog(app, args.jobs, args.max_tokens, rng))
            env = {"ONELANE_LEASE_S": "1", "ONELANE_MAX_ATTEMPTS": str(max_attempts)}
            with onelane_worker(settings, worker_log, **env) as supervisor:
                kills_and_drain(args, store, supervisor, rng, run, worker_log)
        audit(args, store, run, clock, lease)
        run.log_text = worker_log.read_text(errors="replace")
        keep_log(args, worker_log, f"kill-attempts{max_attempts}-worker.log")
    if clock.errors:
        print(f"  ! the event listener saw {clock.errors} errors")
    return report_kill(args, run, wall)


@contextmanager
def observers(store: Store, device: str, limit_s: float) -> Iterator[tuple[EventClock, LeaseWatch]]:
    """The event clock and the lease watch, listening until the block ends (or `limit_s`)."""
    clock = EventClock(store.redis, limit_s=limit_s)
    lease = LeaseWatch(store.redis, device, limit_s=limit_s)
    clock.start()
    lease.start()
    try:
        yield clock, lease
    finally:
        clock.stop.set()
        lease.stop.set()
        clock.join(5)
        lease.join(5)


@contextmanager
def web_app(settings: Settings) -> Iterator[Flask]:
    """The web app in this process: its housekeeper runs beside the workers, as a web's does."""
    app = create_app(settings)
    try:
        yield app
    finally:
        app.extensions[EXTENSION].stop()


def kills_and_drain(
    args: argparse.Namespace,
    store: Store,
    supervisor: subprocess.Popen[bytes],
    rng: random.Random,
    run: KillRun,
    worker_log: Path,
) -> None:
    """Once a worker holds the device: the kills, then every admitted job must end."""
    run.t_start = time.monotonic()
    if wait_for_holder(store, set(), timeout_s=60) is None:
        raise RuntimeError("no worker took the device within 60 s:\n" + tail(worker_log))
    print(f"a worker held the device {time.monotonic() - run.t_start:.2f} s after `onelane worker` started")
    kill_holders(args, store, supervisor, rng, run)
    run.kill_end = time.monotonic()
    run.pending = wait_ended(store, run.ids, args.wait_s, every_s=0.1)  # every admitted job must end
    run.drained = time.monotonic()
    run.stats = store.redis.hgetall(keys.STATS)
    time.sleep(0.3)  # the last events reach the clock


def audit(args: argparse.Namespace, store: Store, run: KillRun, clock: EventClock, lease: LeaseWatch) -> None:
    """Each job's durable record audited (the workers are stopped; Redis is still up), and each kill's recovery."""
    for job_id in run.ids:
        if store.redis.exists(keys.job(job_id)):
            run.audits[job_id] = audit_job(store, job_id, args.max_tokens)
        else:
            run.missing.append(job_id)
    for kill in run.kills:
        token, holder = clock.next_token_after(kill.no), lease.next_holder_after(kill.t, kill.pid)
        kill.token_s = token - kill.t if token is not None else None
        kill.holder_s = holder - kill.t if holder is not None else None


def report_kill(args: argparse.Namespace, run: KillRun, wall: float) -> dict[str, int]:
    lost = report_lost(run)
    twice = report_twice(run)
    report_requeues(run)
    report_recovery(args, run)
    print("per kill: time, pid, was it running a job, s until another process held the device, s until a token:")
    for k in run.kills:
        at = datetime.fromtimestamp(k.wall).strftime("%H:%M:%S.%f")[:-3]
        holder = f"{k.holder_s:6.2f}" if k.holder_s is not None else "     -"
        token = f"{k.token_s:6.2f}" if k.token_s is not None else "     -"
        print(f"  #{k.no + 1:<2} {at} pid {k.pid:<7} {'job  ' if k.job else 'no job'} holder {holder}  token {token}")
    print(
        f"timeline: kills over {run.kill_end - run.t_start:.1f} s; all terminal {run.drained - run.t_start:.1f} s "
        f"after the worker started ({len(run.pending)} not); whole run {time.monotonic() - wall:.1f} s"
    )
    return {"lost": lost, "twice": twice}


def report_lost(run: KillRun) -> int:
    """How the admitted jobs ended; returns how many were lost (missing, or never terminal)."""
    by_status = Counter(a["status"] for a in run.audits.values())
    not_terminal = [j for j, a in run.audits.items() if a["status"] not in TERMINAL]
    lost = len(run.missing) + len(not_terminal)
    print(f"jobs admitted:                  {len(run.ids)}")
    print(
        f"reached a terminal state:       {sum(c for s, c in by_status.items() if s in TERMINAL)}  "
        f"({', '.join(f'{s} {c}' for s, c in sorted(by_status.items()))})"
    )
    print(f"LOST (not terminal or missing): {lost}  (missing {len(run.missing)}, not terminal {len(not_terminal)})")
    return lost


def report_twice(run: KillRun) -> int:
    """The jobs generated twice, by their event logs and by the worker log; returns how many."""
    audits = run.audits
    completed_lines = Counter(COMPLETED_LINE.findall(run.log_text))
    event_problems = {j: a["problems"] for j, a in audits.items() if a["problems"]}
    logged_twice = {j: c for j, c in completed_lines.items() if c > 1}
    completed = {j for j, a in audits.items() if a["status"] == "completed"}
    logged_not_completed = (set(completed_lines) & set(run.ids)) - completed
    # completed in Redis but never logged: the kill landed between the worker's finish() and its log line
    unlogged = completed - set(completed_lines)
    twice = set(event_problems) | set(logged_twice) | logged_not_completed
    print(f"GENERATED TWICE:                {len(twice)}")
    print("  = jobs with any of: in the durable event log (store.events), more than one terminal event, or one that")
    print("  is not last; a `started` after the first without a `requeued` since the previous one; starts !=")
    print("  requeues + 1; attempts != starts; attempts whose token events count (n) more than max_tokens;")
    print("  completed with completion_tokens != max_tokens or output != the text of its token events.")
    print("  In the worker log: a job id logged 'completed' twice, or logged 'completed' while Redis says")
    print("  otherwise.")
    print(
        f"  event-log violations {len(event_problems)}; logged 'completed' twice {len(logged_twice)}; logged "
        f"'completed' but not completed in Redis {len(logged_not_completed)}"
    )
    print("  (completed in Redis without a 'completed' log line, the kill having landed between the worker's")
    print(f"  finish and its log line: {len(unlogged)})")
    for j, problems in list(event_problems.items())[:5]:
        print(f"    {j}: {problems}")
    for j, c in list(logged_twice.items())[:5]:
        print(f"    {j}: 'completed' {c} times in the worker log")
    return len(twice)


def report_requeues(run: KillRun) -> None:
    """Requeues, worker_crashed failures, and the jobs whose worker died under them twice or more."""
    audits = run.audits
    crashed = sum(1 for a in audits.values() if a["status"] == "failed" and a["error"] == "worker_crashed")
    # a job whose worker died under it twice or more: requeued twice, or requeued once then failed worker_crashed
    hit_twice = sum(1 for a in audits.values() if a["requeues"] + (a["error"] == "worker_crashed") >= 2)
    attempts = Counter(a["attempts"] for a in audits.values())
    started_lines = Counter(STARTED_LINE.findall(run.log_text))
    print(
        f"jobs requeued:                  {sum(1 for a in audits.values() if a['requeues'])}  (requeued events "
        f"{sum(a['requeues'] for a in audits.values())}, stats requeued {run.stats.get('requeued', 0)})"
    )
    print(f"failed worker_crashed:          {crashed}")
    print(
        f"jobs whose worker died twice:   {hit_twice}  (attempts per job: "
        f"{', '.join(f'{c} jobs x{a}' for a, c in sorted(attempts.items()))}; 'started' log lines "
        f"{sum(started_lines.values())})"
    )


def report_recovery(args: argparse.Namespace, run: KillRun) -> None:
    """The kills, and how long after each the device had a holder, the supervisor noticed, a token came."""
    kills = run.kills
    tokens = [k.token_s for k in kills if k.token_s is not None]
    holders = [k.holder_s for k in kills if k.holder_s is not None]
    # recovery without another kill in between: the next token came before the next kill
    clean = [
        a.token_s
        for a, b in zip(kills, [*kills[1:], None])
        if a.token_s is not None and (b is None or a.t + a.token_s < b.t)
    ]
    exits = supervisor_exits(run.log_text)
    noticed = [exits[k.pid] - k.wall for k in kills if k.pid in exits]
    waits = [a["wait"] for a in run.audits.values() if a["wait"] is not None]
    print(
        f"kills:                          {len(kills)} of {args.kills}, {sum(1 for k in kills if k.job)} while a "
        f"job was running"
    )
    print(f"worker restarts (stats):        {run.stats.get('worker_restarts', 0)}")
    print(
        f"kill -> next token:             longest {max(tokens, default=float('nan')):.2f} s, median "
        f"{median(tokens):.2f} s (n={len(tokens)}; {len(kills) - len(tokens)} kills never followed by a token)"
    )
    for label, values in (
        ("  ... no kill in between:       ", clean),
        ("kill -> another lease holder:   ", holders),
        ("kill -> supervisor logs exit:   ", noticed),
    ):
        print(
            f"{label}longest {max(values, default=float('nan')):.2f} s, median {median(values):.2f} s (n={len(values)})"
        )
    if waits:
        print(f"queue wait (started-queued):    p50 {pct(waits, 50):.2f} s, max {max(waits):.2f} s")


def supervisor_exits(log_text: str) -> dict[int, float]:
    """When the supervisor logged each worker process's exit (time.time()), by pid."""
    exits = {}
    for stamp, pid in EXITED_LINE.findall(log_text):
        try:
            exits[int(pid)] = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
    return exits


# --- mode overload -----------------------------------------------------------------------------------------


def redis_memory(client: redis.Redis) -> tuple[str, int, int, str]:
    """used_memory_human, used_memory (bytes), number of keys, used_memory_peak_human."""
    info = client.info("memory")
    human, peak = str(info["used_memory_human"]), str(info["used_memory_peak_human"])
    return human, int(info["used_memory"]), int(client.dbsize()), peak


def wait_http(http: Any, base: str, job_id: str, timeout_s: float) -> dict[str, Any]:
    """Poll GET /v1/jobs/<id> (every 10 ms) until the job is terminal; returns it."""
    deadline = time.monotonic() + timeout_s
    while True:
        job: dict[str, Any] = http.get(f"{base}/v1/jobs/{job_id}", timeout=10).json()
        if job["status"] in TERMINAL:
            return job
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id} still {job['status']} after {timeout_s:.0f} s")
        time.sleep(0.01)


@dataclass
class Flood:
    planned: int = 0
    elapsed: float = 0.0
    accepted: list[str] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)  # "status type"
    retry_after: list[int] = field(default_factory=list)
    retry_missing: int = 0
    retry_malformed: list[str] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    latency: list[float] = field(default_factory=list)
    stuck_threads: int = 0

    def record(self, status: int, payload: dict[str, Any], retry_after: str | None, took: float) -> None:
        """One answer: its latency, and its job's id or what the rejection said (and its Retry-After)."""
        self.latency.append(took)
        if status == 202:
            self.accepted.append(payload["id"])
            return
        self.rejected[f"{status} {payload.get('error', {}).get('type')}"] += 1
        if retry_after is None:
            self.retry_missing += 1
        elif retry_after.isdigit() and int(retry_after) > 0:
            self.retry_after.append(int(retry_after))
        else:
            self.retry_malformed.append(retry_after)


def flood(base: str, body: dict[str, Any], rate: float, seconds: float, clients: int) -> Flood:
    """POST at `rate` jobs/s for `seconds` from `clients` threads on an open-loop schedule (bounded)."""
    import requests

    out = Flood(planned=int(rate * seconds))
    lock = threading.Lock()
    tickets = iter(range(out.planned))
    t0 = time.monotonic() + 0.2
    hard_stop = t0 + seconds + 15

    def client() -> None:
        with requests.Session() as http:
            while time.monotonic() < hard_stop:
                with lock:
                    ticket = next(tickets, None)
                if ticket is None:
                    return
                time.sleep(max(0.0, t0 + ticket / rate - time.monotonic()))
                sent = time.monotonic()
                try:
                    response = http.post(f"{base}/v1/jobs", json=body, timeout=10)
                except requests.RequestException as exc:
                    with lock:
                        out.errors[type(exc).__name__] += 1
                    continue
                took = time.monotonic() - sent
                try:
                    payload = response.json()
                except ValueError:
                    payload = {}
                with lock:
                    out.record(response.status_code, payload, response.headers.get("Retry-After"), took)

    threads = [threading.Thread(target=client, name=f"client-{n}", daemon=True) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.1, hard_stop + 12 - time.monotonic()))
    out.elapsed = time.monotonic() - t0
    out.stuck_threads = sum(1 for thread in threads if thread.is_alive())
    return out


def run_overload(args: argparse.Namespace) -> None:
    """The stack up with small queue bounds; its service rate, then the flood at `--factor` times that; the report."""
    import requests

    print(
        f"\n=== mode overload: ONELANE_MAX_QUEUE={args.max_queue}, ONELANE_MAX_QUEUED_PER_USER={args.max_queue}, "
        f"{args.seconds:.0f} s at {args.factor:g}x the service rate from {args.clients} client threads ==="
    )
    wall = time.monotonic()
    with bench_env("tiny") as settings:
        folder = Path(settings.var_dir)
        env = {"ONELANE_LEASE_S": "1", "ONELANE_MAX_ATTEMPTS": "3", **queue_bounds(args.max_queue)}
        store = Store.connect(settings)
        body = {"prompt": "overload", "max_tokens": args.max_tokens, "ignore_eos": True}
        with onelane_stack(settings, ready="/healthz", **env) as stack, requests.Session() as http:
            if wait_for_holder(store, set(), 60) is None:
                raise RuntimeError("no worker took the device within 60 s:\n" + tail(folder / "worker.log"))
            rate = service_rate(http, stack.url, body, args)
            mem_before = redis_memory(store.redis)
            result = flood(stack.url, body, rate * args.factor, args.seconds, args.clients)
            mem_after = redis_memory(store.redis)
            unfinished = wait_ended(store, result.accepted, args.drain_s, every_s=0.1)  # every accepted job must end
            time.sleep(0.5)
            mem_done = redis_memory(store.redis)
            jobs = [http.get(f"{stack.url}/v1/jobs/{i}", timeout=10).json() for i in result.accepted]
            alive = stack.alive
        report_overload(args, rate, result, jobs, unfinished, (mem_before, mem_after, mem_done), alive, wall)
        keep_log(args, folder / "worker.log", "overload-worker.log")
        keep_log(args, folder / "web.log", "overload-web.log")


def service_rate(http: Any, base: str, body: dict[str, Any], args: argparse.Namespace) -> float:
    """Jobs per second one after another, each submitted once the previous one ended (after one to warm up)."""
    wait_http(http, base, http.post(f"{base}/v1/jobs", json=body, timeout=10).json()["id"], 60)  # warm-up
    started = time.perf_counter()
    seq = [
        wait_http(http, base, http.post(f"{base}/v1/jobs", json=body, timeout=10).json()["id"], 30)
        for _ in range(args.rate_jobs)
    ]
    rate = args.rate_jobs / (time.perf_counter() - started)
    service = [j["timings"]["finished_at"] - j["timings"]["started_at"] for j in seq]
    print(
        f"service rate: {args.rate_jobs} jobs one after another (submit, poll until ended) = "
        f"{rate:.2f} jobs/s; generation alone median {median(service) * 1000:.0f} ms/job "
        f"({args.max_tokens} tokens)"
    )
    return rate


def report_overload(
    args: argparse.Namespace,
    rate: float,
    result: Flood,
    jobs: list[dict[str, Any]],
    unfinished: list[str],
    memory: tuple[Any, ...],
    alive: bool,
    wall: float,
) -> None:
    report_flood(args, rate, result)
    report_accepted(rate, jobs, unfinished)
    print("Redis memory (INFO memory):")
    for label, m in zip(("before the flood", "after the flood", "after every job ended"), memory):
        print(f"  {label:<22} used_memory_human {m[0]:>7} = {m[1]} bytes; {m[2]} keys; peak so far {m[3]}")
    print("  (ended jobs and their output are kept for ONELANE_RESULT_TTL, so the last line still holds them all)")
    print(
        f"worker and web still up at the end: {alive}; client threads stuck: {result.stuck_threads}; "
        f"whole run {time.monotonic() - wall:.1f} s"
    )


def report_flood(args: argparse.Namespace, rate: float, result: Flood) -> None:
    """What was sent, accepted and rejected (with which Retry-After), and how fast the answers came."""
    submitted = len(result.accepted) + sum(result.rejected.values())
    rejected = sum(result.rejected.values())
    print(
        f"target {rate * args.factor:.1f} jobs/s for {args.seconds:.0f} s = {result.planned} requests; sent in "
        f"{result.elapsed:.1f} s = {submitted / max(result.elapsed, 1e-9):.1f} requests/s"
    )
    errors = f" {dict(result.errors)}" if result.errors else ""
    print(f"submitted:        {submitted}  (+ {sum(result.errors.values())} without an answer{errors})")
    print(f"accepted (202):   {len(result.accepted)}")
    print(
        f"rejected:         {rejected}  ({', '.join(f'{k}: {v}' for k, v in sorted(result.rejected.items())) or '-'})"
    )
    ra = result.retry_after
    values = f"; values min {min(ra)}, median {median(ra):g}, max {max(ra)} s" if ra else ""
    bad = f" {result.retry_malformed[:5]}" if result.retry_malformed else ""
    print(
        f"Retry-After:      a positive integer on {len(ra)} of {rejected} rejections; missing on "
        f"{result.retry_missing}, malformed on {len(result.retry_malformed)}{bad}{values}"
    )
    if result.latency:
        lat = result.latency
        print(
            f"POST latency:     p50 {pct(lat, 50) * 1000:.1f} ms, p99 {pct(lat, 99) * 1000:.1f} ms, "
            f"max {max(lat) * 1000:.1f} ms"
        )


def report_accepted(rate: float, jobs: list[dict[str, Any]], unfinished: list[str]) -> None:
    """How the accepted jobs ended, how long they waited, and the throughput under load."""
    print(f"accepted jobs:    ended {dict(Counter(j['status'] for j in jobs))}; not terminal {len(unfinished)}")
    waits = [j["timings"]["started_at"] - j["timings"]["queued_at"] for j in jobs if j["timings"]["started_at"]]
    if waits:
        print(
            f"wait of accepted jobs (timings.started_at - queued_at): longest {max(waits):.2f} s, "
            f"p50 {pct(waits, 50):.2f} s, p99 {pct(waits, 99):.2f} s (n={len(waits)})"
        )
        done = [j for j in jobs if j["status"] == "completed"]
        if done:
            span = max(j["timings"]["finished_at"] for j in done) - min(j["timings"]["queued_at"] for j in jobs)
            print(
                f"throughput:       {len(done)} accepted jobs completed in {span:.1f} s = {len(done) / span:.2f} "
                f"jobs/s under load (one after another: {rate:.2f} jobs/s)"
            )


# --- main --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    failures = []
    if args.mode in ("kill", "both"):
        explain_attempts(args)
        for max_attempts in args.attempts:
            outcome = run_kill(args, max_attempts)
            if outcome["lost"] or outcome["twice"]:
                failures.append(
                    f"kill, MAX_ATTEMPTS={max_attempts}: {outcome['lost']} lost, {outcome['twice']} generated twice"
                )
    if args.mode in ("overload", "both"):
        run_overload(args)
    if failures:
        print("\nFAILED: " + "; ".join(failures))
        sys.exit(1)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["kill", "overload", "both"], default="kill")
    parser.add_argument("--jobs", type=int, default=200, help="kill: jobs in the backlog")
    parser.add_argument("--kills", type=int, default=20, help="kill: SIGKILLs of the lease holder")
    parser.add_argument(
        "--attempts",
        type=int,
        nargs="+",
        default=[3],
        help="kill: ONELANE_MAX_ATTEMPTS, one run per value (e.g. --attempts 3 2)",
    )
    parser.add_argument(
        "--kill-order",
        choices=["holder-first", "wait-first"],
        default="holder-first",
        help="kill: holder-first waits for a new lease holder, then 0.3-2.0 s, then kills it; "
        "wait-first waits 0.3-2.0 s, then kills the holder as soon as there is one (often while "
        "it is still starting)",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=60, help="per job (ignore_eos)")
    parser.add_argument("--wait-s", type=float, default=180.0, help="kill: bound on the kills and on the drain")
    parser.add_argument("--seconds", type=float, default=60.0, help="overload: how long to submit")
    parser.add_argument("--factor", type=float, default=10.0, help="overload: multiple of the service rate")
    parser.add_argument("--clients", type=int, default=8, help="overload: client threads")
    parser.add_argument("--max-queue", type=int, default=64, help="overload: ONELANE_MAX_QUEUE and per-user bound")
    parser.add_argument("--rate-jobs", type=int, default=20, help="overload: jobs timed one after another")
    parser.add_argument("--drain-s", type=float, default=120.0, help="overload: bound on waiting for accepted jobs")
    parser.add_argument("--keep-logs", metavar="DIR", help="copy the worker and web logs into DIR")
    args = parser.parse_args(argv)
    for name in ("jobs", "kills", "max_tokens", "clients", "max_queue", "rate_jobs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 1 <= args.factor <= 100 or not 0 < args.seconds <= 600:
        parser.error("--factor must be in [1, 100] and --seconds in (0, 600]")
    return args


def explain_attempts(args: argparse.Namespace) -> None:
    """Why the kill mode runs with the ONELANE_MAX_ATTEMPTS it does."""
    print(
        f"Why ONELANE_MAX_ATTEMPTS={'/'.join(map(str, args.attempts))} (default 2): a job whose worker dies is "
        "requeued at the front and"
    )
    print("runs first on the next worker; after MAX_ATTEMPTS starts it ends failed `worker_crashed` instead (the")
    print(
        f"quarantine for a prompt that kills the worker). With {args.kills} kills at random among {args.jobs} "
        "jobs, a kill can land"
    )
    print("on the worker that is re-running the job the previous kill requeued: that job is hit twice. With the")
    print("default 2 it would end failed worker_crashed though it crashed nothing (not lost, but a spurious")
    print("failure); with 3 it survives one such double hit. `--attempts 3 2` runs both.")


if __name__ == "__main__":
    main()
