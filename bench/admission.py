"""Admission: how fast the production web server admits jobs, and what a million waiting jobs cost Redis.

1. `onelane web --workers N` (gunicorn, gevent) against a private Redis, bounds raised so nothing is rejected
   and no worker running: `wrk` (one thread, keep-alive connections, closed loop) POSTs
   {"prompt":"hi","max_tokens":8} to /v1/jobs for `--seconds` at each `--concurrency`. Prints submits/s,
   latency p50/p99/max (wrk's own histogram), and the CPU used by the web processes, Redis, wrk and whatever
   else runs on the machine (from /proc), per second and per submit. Then, for the first N: GET /healthz as a
   reference (the server with no Redis work), the Redis commands one submit costs (MONITOR over a few
   sequential submits) and, with `--profile` and py-spy on PATH, where the worker's CPU goes.
2. The store directly: admit `--jobs` waiting jobs from `--owners` owners through the admit script (exactly
   the arguments Store.admit passes) in pipelines of `--batch`; prints the fill rate, Redis used_memory
   before/after, bytes per waiting job and where they go, and the latency of a position lookup
   (Store.standing and the raw position script) for `--lookups` random jobs.

Needs `wrk` (Debian: apt-get install -y wrk). Run: .venv/bin/python -m bench.admission [--profile] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import resource
import shutil
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.harness import bench_env, free_port, http_request, onelane_web, queue_bounds, tail
from bench.proc import children, cpu_now, cpu_seconds, redis_cpu
from bench.report import summary
from tasks import eta, keys
from tasks.job import JobSpec, SamplingParams, new_job_id
from tasks.scripts import ordered, source
from tasks.store import Store

BODY = '{"prompt":"hi","max_tokens":8}'
BOUND = 10_000_000

REPORT_LUA = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %d %d %d %d %d %d %d %d %d\\n", summary.duration, summary.requests,
    e.connect, e.read, e.write, e.status, e.timeout, latency:percentile(50), latency:percentile(99), latency.max))
end
"""
WRK_SCRIPT = (
    """
wrk.method = "POST"
wrk.body = 'BODY_JSON'
wrk.headers["Content-Type"] = "application/json"
""".replace("BODY_JSON", BODY)
    + REPORT_LUA
)
# wrk counts answers >= 400 as e.status; the 202s are also checked against Redis's own count of admissions.


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_wrk(port: int, connections: int, seconds: float, script: Path, path: str = "/v1/jobs") -> dict[str, Any]:
    cmd = [
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{seconds:g}s",
        "--timeout",
        "10s",
        "-s",
        str(script),
        f"http://127.0.0.1:{port}{path}",
    ]
    before = children_cpu()
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=seconds + 30)
    wrk_cpu = children_cpu() - before
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    dur, reqs, e_conn, e_read, e_write, e_status, e_timeout, p50, p99, mx = (int(x) for x in line.split()[1:])
    return {
        "seconds": dur / 1e6,
        "requests": reqs,
        "errors": e_conn + e_read + e_write + e_timeout,
        "non2xx": e_status,
        "p50_ms": p50 / 1000,
        "p99_ms": p99 / 1000,
        "max_ms": mx / 1000,
        "wrk_cpu": wrk_cpu,
    }


def admitted(client: redis.Redis) -> int:
    return int(client.hget(keys.STATS, "admitted") or 0)


def settle(client: redis.Redis, limit_s: float = 10.0) -> int:
    """Wait until the admission count stops moving (requests wrk left in flight are done); returns it."""
    last, deadline = admitted(client), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = admitted(client)
        if now == last:
            return now
        last = now
    return last


def submit_level(
    port: int, pids: list[int], client: redis.Redis, conns: int, seconds: float, script: Path
) -> dict[str, Any]:
    """wrk at `conns` connections for `seconds`: its figures, plus the CPU each part used and the failures."""
    n0 = settle(client)
    before = cpu_now(pids, client)
    r = run_wrk(port, conns, seconds, script)
    web_cpu, redis_used, busy = (b - a for a, b in zip(before, cpu_now(pids, client)))
    n1 = settle(client)
    in_flight = (n1 - n0) - r["requests"]  # admitted after wrk stopped counting: at most one per connection
    return {
        **r,
        "rate": r["requests"] / r["seconds"],
        "web_cpu": web_cpu,
        "redis_cpu": redis_used,
        "other": busy - web_cpu - redis_used - r["wrk_cpu"],
        "admitted": n1 - n0,
        "failed": r["errors"] + r["non2xx"] + (0 if 0 <= in_flight <= conns else abs(in_flight)),
    }


def level_row(workers: int, conns: int, r: dict[str, Any]) -> str:
    """One row of the submit-rate table (and what failed, if anything did)."""
    dur, n = r["seconds"], max(r["requests"], 1)
    row = (
        f"{workers:>4} {conns:>6} {r['rate']:>11.0f} {r['p50_ms']:>9.2f} {r['p99_ms']:>8.2f} {r['max_ms']:>8.1f} "
        f"{r['failed']:>7}  | {'':>6}{100 * r['web_cpu'] / dur:>5.0f} {100 * r['redis_cpu'] / dur:>6.0f} "
        f"{100 * r['wrk_cpu'] / dur:>4.0f} {100 * r['other'] / dur:>6.0f}  {1e3 * r['web_cpu'] / n:>5.2f} "
        f"{1e6 * r['redis_cpu'] / n:>5.0f}"
    )
    if r["failed"]:
        row += (
            f"\n       ! wrk: {r['errors']} socket errors/timeouts, {r['non2xx']} answers >= 400; Redis counted "
            f"{r['admitted']} admissions for {r['requests']} answered requests"
        )
    return row


def http_part(args: argparse.Namespace, settings: Any, folder: Path) -> None:
    client = Store.connect(settings).redis
    script = folder / "post.lua"
    script.write_text(WRK_SCRIPT)
    best: dict[int, tuple[float, int, float]] = {}
    print(
        f"\n=== submit rate through `onelane web` (gunicorn gevent), no worker; wrk -t1 (closed loop, keep-alive), "
        f"{args.seconds:g} s per level, body {BODY} ==="
    )
    print("CPU columns: % of one core over the run (the machine has 2); `other` = everything else on the machine")
    print(
        " web  conns   submits/s    p50 ms   p99 ms   max ms  failed  | CPU %:  web  redis  wrk  other  "
        "web ms/submit  redis us/submit"
    )
    for workers in args.workers:
        client.flushall()
        port = free_port()
        log = folder / f"web-{workers}.log"
        with onelane_web(settings, port, log, workers, quiet=True, **queue_bounds(BOUND)) as web:
            pids = [web.pid, *children(web.pid)]
            for _ in range(50 * workers):  # warm-up: imports, script loading, connection pools in every worker
                status, body = http_request(port, "POST", "/v1/jobs", BODY.encode())
                assert status == 202, (status, body)
            for conns in args.concurrency:
                r = submit_level(port, pids, client, conns, args.seconds, script)
                if r["rate"] > best.get(workers, (0.0, 0, 0.0))[0]:
                    best[workers] = (r["rate"], conns, r["p99_ms"])
                print(level_row(workers, conns, r))
            if workers == args.workers[0]:
                healthz_reference(port, pids, args, folder)
                commands_per_submit(client, settings.effective_redis_url, port)
            if args.profile and workers == args.workers[0]:
                profile_worker(port, children(web.pid)[0], max(args.concurrency), script, folder)
            if web.poll() is not None:
                print(f"  ! onelane web exited:\n{tail(log)}")
    for workers, (rate, conns, p99) in best.items():
        print(f"best with --workers {workers}: {rate:.0f} submits/s (at {conns} connections, p99 {p99:.1f} ms)")
    client.close()


def healthz_reference(port: int, pids: list[int], args: argparse.Namespace, folder: Path) -> None:
    """GET /healthz at the middle concurrency: the server with no Redis work, for reference."""
    reference = folder / "get.lua"
    reference.write_text(REPORT_LUA)
    conns = args.concurrency[len(args.concurrency) // 2]
    web0 = cpu_seconds(pids)
    r = run_wrk(port, conns, min(args.seconds, 6.0), reference, "/healthz")
    per = (cpu_seconds(pids) - web0) / max(r["requests"], 1)
    print(
        f"reference, GET /healthz (no Redis) at {conns} connections: {r['requests'] / r['seconds']:.0f} "
        f"requests/s, p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms; web CPU {per * 1e3:.2f} ms "
        f"per request"
    )


PROFILE_PARTS = [  # (label, substrings of py-spy frames; a sample counts when any frame of its stack matches)
    ("the view: submit() in web/api.py", ["submit (web/api.py"]),
    (
        "  body parsing + validation (json_body, parse, to_spec)",
        ["json_body (web/", "parse (web/schemas.py", "to_spec (web/"],
    ),
    ("  Store.admit (admit script round trip)", ["Store.admit (tasks/store/jobs.py"]),
    ("  send_run_next (dramatiq message + enqueue script + wake pipeline)", ["send_run_next (tasks/broker.py"]),
    ("  Store.get (HGETALL+GET pipeline, position script, Job model)", ["Store.get (tasks/store/jobs.py"]),
    ("  job_response (Job.public + jsonify) and url_for", ["job_response (web/api.py", "url_for (flask"]),
    ("redis-py, anywhere (command packing, socket I/O, reply parsing)", ["(redis/"]),
    ("pydantic, anywhere", ["(pydantic"]),
    ("dramatiq, anywhere", ["(dramatiq/"]),
    (
        "gunicorn: reading + parsing the HTTP request",
        [
            "(gunicorn/http/message.py",
            "(gunicorn/http/parser.py",
            "(gunicorn/http/unreader.py",
            "(gunicorn/http/body.py",
        ],
    ),
    (
        "gunicorn: writing the response",
        ["Response.send_headers (gunicorn", "Response.write (gunicorn", "Response.close (gunicorn"],
    ),
]
VIEW = "submit (web/api.py"


def profile_worker(port: int, pid: int, conns: int, script: Path, folder: Path, seconds: float = 8.0) -> None:
    """Sample the gunicorn worker with py-spy while wrk saturates it; print where its CPU goes."""
    spy = shutil.which("py-spy")
    if spy is None:
        print("(no py-spy on PATH: `pip install py-spy` for the profile)")
        return
    out = folder / "profile.txt"
    recorder = subprocess.Popen(
        [spy, "record", "-p", str(pid), "-d", f"{seconds:g}", "-r", "250", "-f", "raw", "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        run_wrk(port, conns, seconds + 2, script)
        recorder.wait(timeout=30)
    finally:
        if recorder.poll() is None:
            recorder.kill()
            recorder.wait()
    stacks = []
    for line in out.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks.append((frames, int(count)))
    total = sum(c for _, c in stacks)
    if not total:
        print("(py-spy recorded nothing)")
        return
    print(
        f"where the web worker's CPU goes at {conns} connections (py-spy, {total} samples of the busy thread, "
        f"inclusive: a sample counts in every line whose frames it has):"
    )
    for label, needles in PROFILE_PARTS:
        n = sum(c for frames, c in stacks if any(needle in frames for needle in needles))
        print(f"  {100 * n / total:5.1f} %  {label}")
    outside = [(frames, c) for frames, c in stacks if VIEW not in frames]
    framework = sum(c for frames, c in outside if "(flask/" in frames or "(werkzeug/" in frames)
    print(
        f"  {100 * sum(c for _, c in outside) / total:5.1f} %  outside the view (gunicorn, flask, werkzeug, gevent); "
        f"of it flask/werkzeug {100 * framework / total:.1f} %"
    )
    leaves: Counter[str] = Counter()
    for frames, c in stacks:
        leaves[frames.rsplit(";", 1)[-1].split(" (")[0]] += c
    print("  top leaf functions: " + ", ".join(f"{name} {100 * c / total:.1f} %" for name, c in leaves.most_common(6)))


def commands_per_submit(client: redis.Redis, url: str, port: int, n: int = 5) -> None:
    """The Redis commands behind one submit, from MONITOR over `n` sequential submits."""
    seen = monitored(client, url, lambda: submit_n(port, n), 100 * n + 100)
    top = [c for c in seen if c.get("client_type") != "lua"]
    lua = [c for c in seen if c.get("client_type") == "lua"]
    names = Counter(c["command"].split(" ", 1)[0].upper() for c in top)
    print(
        f"Redis commands per submit (MONITOR, {n} sequential submits): {len(top) / n:.1f} sent by the web "
        f"({', '.join(f'{k} x{v / n:g}' for k, v in names.most_common())}), "
        f"{len(lua) / n:.1f} more run inside Lua scripts"
    )
    per = len(top) // n
    if per:
        print("  one submit, in order: " + " | ".join(command_name(c["command"]) for c in top[:per]))


def submit_n(port: int, n: int) -> None:
    for _ in range(n):
        status, _ = http_request(port, "POST", "/v1/jobs", BODY.encode())
        assert status == 202


def command_name(command: str) -> str:
    """A MONITOR line's command, and for EVALSHA the start of the script's sha."""
    name = command.split(" ", 1)[0].upper()
    return name + (" " + command.split(" ")[1][:40] if command.upper().startswith(('"EVALSHA', "EVALSHA")) else "")


def monitored(client: redis.Redis, url: str, act: Any, most: int) -> list[dict[str, Any]]:
    """The commands Redis ran while `act()` ran (MONITOR on a connection of its own; at most `most`)."""
    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    sentinel = f"bench-monitor-end-{random.random()}"

    def watch() -> None:
        monitor_client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10)
        with monitor_client.monitor() as m:
            ready.set()
            for _ in range(most):  # bounded: a submit costs far fewer commands
                try:
                    cmd = m.next_command()
                except (redis.TimeoutError, redis.ConnectionError):
                    return
                if sentinel in cmd["command"]:
                    return
                seen.append(cmd)
        monitor_client.close()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    ready.wait(5)
    time.sleep(0.2)
    act()
    time.sleep(0.2)
    client.echo(sentinel)
    thread.join(15)
    return seen


# --- a million waiting jobs --------------------------------------------------------------------------------------


class Captured(Exception):
    """The admit script's arguments are captured: Store.admit goes no further."""


def bulk(value: object) -> bytes:
    """One argument in Redis's wire protocol (RESP)."""
    raw = value if isinstance(value, bytes) else str(value).encode()
    return b"$%d\r\n%s\r\n" % (len(raw), raw)


def packed_admits(store: Store, owners: int) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The admit script exactly as Store.admit runs it (same script, same arguments), as EVALSHA packed for the
    socket: the command's head (the same for every job), and each owner's arguments before and after the job id.

    The arguments are captured from Store.admit itself: a stand-in for its scripts stops it there, so nothing depends
    on the shape of the script's answer."""
    s = store.settings
    sha = store.redis.script_load(source("admit"))
    captured: list[list[object]] = []

    class Recorder:
        def run(self, name: str, pipe: object = None, **named: object) -> None:
            captured.append(ordered(name, named))
            raise Captured

    capture = Store(store.redis, s)
    capture.scripts = Recorder()  # type: ignore[assignment]
    owner_bytes = []
    for u in range(owners):
        spec = JobSpec(owner=f"user{u:03d}", model=s.model_name, prompt="hi", params=SamplingParams(max_tokens=8))
        with contextlib.suppress(Captured):
            capture.admit("JOB-ID", JobSpec.model_validate_json(spec.model_dump_json()), s.job_ttl_s)
        args, at = captured[-1], captured[-1].index("JOB-ID")
        owner_bytes.append((b"".join(bulk(a) for a in args[:at]), b"".join(bulk(a) for a in args[at + 1 :])))
    head = b"*%d\r\n" % (3 + len(captured[0])) + b"".join(bulk(a) for a in ["EVALSHA", sha, 0])
    return head, owner_bytes


@dataclass
class Fill:
    """How the fill went: jobs admitted, in how long, and the ids of the jobs sampled for position lookups."""

    done: int = 0
    elapsed: float = 0.0
    sampled: dict[int, str] = field(default_factory=dict)  # admission number -> job id


def fill(client: redis.Redis, head: bytes, owner_bytes: list[tuple[bytes, bytes]], args: argparse.Namespace) -> Fill:
    """`--jobs` admissions in pipelines of `--batch` written straight to the socket (building commands with redis-py
    would cap the fill at the client's speed); while Redis runs one batch, the next is encoded and sent."""
    sample_at = set(random.Random(7).sample(range(args.jobs), min(args.lookups, args.jobs)))
    out = Fill()
    conn = client.connection_pool.get_connection()
    started = last = time.perf_counter()
    deadline = started + args.fill_timeout
    sent = 0
    pending: list[int] = []  # sizes of the batches sent and not yet answered
    try:
        while out.done < args.jobs:
            if sent < args.jobs and time.perf_counter() < deadline and len(pending) < 2:
                size = min(args.batch, args.jobs - sent)
                conn.send_packed_command([packed_batch(head, owner_bytes, range(sent, sent + size), sample_at, out)])
                pending.append(size)
                sent += size
                if len(pending) < 2 and sent < args.jobs:
                    continue
            if not pending:
                break
            out.done += read_replies(conn, pending.pop(0))
            if out.done % args.progress == 0 or out.done == args.jobs:
                last = progress(client, out.done, started, last, args.progress)
    finally:
        client.connection_pool.release(conn)
    out.elapsed = time.perf_counter() - started
    return out


def packed_batch(
    head: bytes, owner_bytes: list[tuple[bytes, bytes]], numbers: range, sample_at: set[int], out: Fill
) -> bytes:
    """The admissions `numbers` (fresh job ids, owners in turn) as one pipeline; noting the sampled ones' ids."""
    parts = []
    for i in numbers:
        job_id = new_job_id()
        if i in sample_at:
            out.sampled[i] = job_id
        before, after = owner_bytes[i % len(owner_bytes)]
        parts.append(head + before + bulk(job_id) + after)
    return b"".join(parts)


def read_replies(conn: Any, size: int) -> int:
    """A batch's `size` replies, each the admit script's "ok"; returns `size`."""
    for _ in range(size):
        reply = conn.read_response()
        if not isinstance(reply, list) or reply[0] != "ok":
            raise RuntimeError(f"admission refused: {reply!r}")
    return size


def progress(client: redis.Redis, done: int, started: float, last: float, step: int) -> float:
    """A progress line; returns its time."""
    now = time.perf_counter()
    print(
        f"  {done:>9,} admitted  {now - started:6.1f} s  {step / (now - last):>8,.0f} jobs/s "
        f"(this step), Redis used_memory {used_memory(client) / 2**20:,.0f} MiB"
    )
    return now


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def fill_part(args: argparse.Namespace, settings: Any) -> None:
    """Admit `--jobs` waiting jobs through the admit script; what they cost Redis and what a position lookup takes."""
    store = Store.connect(settings.model_copy(update={"max_queue": BOUND, "max_queued_per_user": BOUND}))
    client = store.redis
    client.flushall()
    print(
        f"\n=== {args.jobs:,} waiting jobs admitted through the admit script, {args.owners} owners, "
        f"pipelines of {args.batch} ==="
    )
    head, owner_bytes = packed_admits(store, args.owners)
    mem0, cpu0 = used_memory(client), redis_cpu(client)
    filled = fill(client, head, owner_bytes, args)
    redis_busy = redis_cpu(client) - cpu0
    waiting = report_fill(store, args, filled, mem0, redis_busy)
    one = next(iter(filled.sampled.values()))
    report_record(client, one, args.owners, filled.done)
    report_lookups(store, filled, waiting)
    client.close()  # the server goes with bench_env; a FLUSHALL of this much would outlast the socket timeout


def report_fill(store: Store, args: argparse.Namespace, filled: Fill, mem0: int, redis_busy: float) -> int:
    """The fill's rate, what is waiting and the memory it takes; returns how many wait."""
    client, done, elapsed = store.redis, filled.done, filled.elapsed
    mem1 = used_memory(client)
    waiting = store.readings.waiting()
    if done < args.jobs:
        print(f"  ! stopped at the {args.fill_timeout:g} s bound with {done:,} admitted")
    print(
        f"fill: {done:,} jobs in {elapsed:.1f} s = {done / elapsed:,.0f} admissions/s "
        f"(Redis CPU {100 * redis_busy / elapsed:.0f} % of one core, {1e6 * redis_busy / done:.1f} us per admit)"
    )
    print(
        f"waiting (ZCARD onelane:waiting) = {waiting:,}, queue = {client.zcard(keys.QUEUE):,}, "
        f"keys = {client.dbsize():,}"
    )
    print(
        f"Redis used_memory: before {mem0 / 2**20:.1f} MiB, after {mem1 / 2**20:.1f} MiB -> "
        f"{(mem1 - mem0) / done:.0f} bytes per waiting job"
    )
    return waiting


def report_record(client: redis.Redis, one: str, owners: int, done: int) -> None:
    """Where a waiting job's bytes go: its record and its entries in the sets, per job."""
    record = client.memory_usage(keys.job(one), samples=0) or 0
    sets = {
        "queue": [keys.QUEUE],
        "waiting": [keys.WAITING],
        "owners' queues": [keys.user_queue(f"user{u:03d}") for u in range(owners)],
        "owners' listings (newest 1000 each)": [keys.user_jobs(f"user{u:03d}") for u in range(owners)],
    }
    per_set = {name: sum(client.memory_usage(k, samples=0) or 0 for k in names) / done for name, names in sets.items()}
    print(
        f"  where it goes, per job: record {record} B (a hash, encoding {client.object('encoding', keys.job(one))}; "
        f"its spec field alone is {len(client.hget(keys.job(one), 'spec') or '')} B), "
        + ", ".join(f"{name} {size:.0f} B" for name, size in per_set.items())
        + ", the rest is the keyspace's own entries"
    )
    compact_record(client, one)


def compact_record(client: redis.Redis, one: str) -> None:
    """The same record if Redis kept such hashes compact (hash-max-listpack-value is 64 bytes by default)."""
    limit = client.config_get("hash-max-listpack-value")["hash-max-listpack-value"]
    probe = "bench:probe-record"
    try:
        client.config_set("hash-max-listpack-value", 4096)
        client.hset(probe, mapping=client.hgetall(keys.job(one)))
        compact = client.memory_usage(probe, samples=0)
        print(
            f"  the same record with hash-max-listpack-value 4096 (instead of {limit}): {compact} B, "
            f"{client.object('encoding', probe)}"
        )
    finally:
        client.delete(probe)
        client.config_set("hash-max-listpack-value", limit)


def report_lookups(store: Store, filled: Fill, waiting: int) -> None:
    """Position lookups for the sampled waiting jobs, in a random order: Store.standing, the raw script, ZRANK."""
    client = store.redis
    jobs = {i: store.get(job_id) for i, job_id in filled.sampled.items() if i < filled.done}
    order = list(jobs.items())
    random.Random(11).shuffle(order)
    standing, raw, zrank = [], [], []
    wrong = 0
    for i, job in order:
        t0 = time.perf_counter()
        st = store.standing(job)
        t1 = time.perf_counter()
        store.scripts.run("position", limit=eta.LIMIT, ids=[job.id])  # as Store.standings runs it
        t2 = time.perf_counter()
        client.zrank(keys.QUEUE, job.id)
        t3 = time.perf_counter()
        standing.append(t1 - t0)
        raw.append(t2 - t1)
        zrank.append(t3 - t2)
        wrong += st.position != i + 1  # round-robin admission with equal tags: position = admission order
    print(f"position lookups over {len(order)} random jobs of {waiting:,} waiting (client round trip included):")
    print(f"  Store.standing(job):    {summary(standing)}")
    print(f"  raw position script:    {summary(raw)}")
    print(f"  plain ZRANK (floor):    {summary(zrank)}")
    print(f"  positions equal to admission order: {len(order) - wrong} of {len(order)}")
    evalsha = client.info("commandstats").get("cmdstat_evalsha", {})
    print(
        f"  Redis commandstats: EVALSHA {evalsha.get('calls')} calls, {evalsha.get('usec_per_call')} us per call "
        f"(admit and position together)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--owners", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--progress", type=int, default=100_000)
    parser.add_argument("--fill-timeout", type=float, default=100.0)
    parser.add_argument("--lookups", type=int, default=1000)
    parser.add_argument("--skip-http", action="store_true")
    parser.add_argument("--skip-fill", action="store_true")
    parser.add_argument("--profile", action="store_true", help="py-spy the web worker at the highest concurrency")
    parser.add_argument("--quick", action="store_true", help="3 s per level, 50,000 jobs")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.jobs, args.progress = 3.0, 50_000, 10_000
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.workers = [int(w) for w in args.workers.split(",")]
    if not args.skip_http and shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install -y wrk")
    wall = time.monotonic()
    with bench_env("tiny") as settings:
        if not args.skip_http:
            http_part(args, settings, Path(settings.var_dir))
        if not args.skip_fill:
            fill_part(args, settings)
    print(f"\ntotal {time.monotonic() - wall:.0f} s")


if __name__ == "__main__":
    main()
