"""Admission: how fast the production web server admits jobs, and what a million waiting jobs cost Redis.

1. `onelane web --workers N` (gunicorn, gevent) against a private Redis, bounds raised so nothing is rejected
   and no worker running: `wrk` (one thread, keep-alive connections, closed loop) POSTs
   {"prompt":"hi","max_tokens":8} to /v1/jobs for `--seconds` at each `--concurrency`. Prints submits/s,
   latency p50/p99/max (wrk's own histogram), and the CPU used by the web processes, Redis and wrk.
   Then the Redis commands one submit costs, watched with MONITOR over a few sequential submits.
2. The store directly: admit `--jobs` waiting jobs from `--owners` owners through the admit script in
   pipelines of `--batch`; prints Redis used_memory before/after, bytes per waiting job, the fill rate, and
   the latency of a position lookup (Store.standing and the raw position script) for `--lookups` random jobs.

Needs `wrk` (Debian: apt-get install -y wrk). Run: .venv/bin/python -m bench.admission [--quick]
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from bench._load import cpu_seconds, children, free_port, http_request, onelane_web, redis_cpu, tail
from bench.common import bench_env, pct, summary
from tasks import keys
from tasks.job import JobSpec, SamplingParams, new_job_id
from tasks.store import Store, connect

BODY = '{"prompt":"hi","max_tokens":8}'
BOUND = 10_000_000

WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
local codes = {}
response = function(status, headers, body)
  codes[status] = (codes[status] or 0) + 1
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %%d %%d %%d %%d %%d %%d %%d %%d %%d %%d\\n", summary.duration, summary.requests,
    e.connect, e.read, e.write, e.status, e.timeout, latency:percentile(50), latency:percentile(99), latency.max))
end
""" % BODY
# `response` runs in wrk's thread state, `done` in another: status codes are checked against Redis's own count.


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_wrk(port: int, connections: int, seconds: float, script: Path) -> dict[str, Any]:
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s", "-s", str(script),
           f"http://127.0.0.1:{port}/v1/jobs"]  # fmt: skip
    before = children_cpu()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30)
    wrk_cpu = children_cpu() - before
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    dur, reqs, e_conn, e_read, e_write, e_status, e_timeout, p50, p99, mx = (int(x) for x in line.split()[1:])
    return {"seconds": dur / 1e6, "requests": reqs, "errors": e_conn + e_read + e_write + e_timeout,
            "non2xx": e_status, "p50_ms": p50 / 1000, "p99_ms": p99 / 1000, "max_ms": mx / 1000, "wrk_cpu": wrk_cpu}  # fmt: skip


def admitted(client: redis.Redis) -> int:
    return int(client.hget(keys.STATS, "admitted") or 0)


def http_part(args: argparse.Namespace, settings: Any, folder: Path) -> None:
    client = connect(settings.effective_redis_url)
    script = folder / "post.lua"
    script.write_text(WRK_SCRIPT)
    bounds = {"ONELANE_MAX_QUEUE": str(BOUND), "ONELANE_MAX_QUEUED_PER_USER": str(BOUND)}
    best: dict[int, float] = {}
    print(f"\n=== submit rate through `onelane web` (gunicorn gevent), no worker; wrk -t1, {args.seconds:g} s per "
          f"level, body {BODY} ===")  # fmt: skip
    print(" web  conns   submits/s    p50 ms   p99 ms   max ms  errors  | CPU (% of one core): web    redis   wrk")
    for workers in args.workers:
        client.flushall()
        port = free_port()
        log = folder / f"web-{workers}.log"
        with onelane_web(settings, port, workers, log, **bounds) as web:
            pids = [web.pid, *children(web.pid)]
            for _ in range(50):  # warm-up: imports, script loading, connection pools in every worker
                status, body = http_request(port, "POST", "/v1/jobs", BODY.encode())
                assert status == 202, (status, body)
            for conns in args.concurrency:
                n0, web0, redis0 = admitted(client), cpu_seconds(pids), redis_cpu(client)
                r = run_wrk(port, conns, args.seconds, script)
                n1, web1, redis1 = admitted(client), cpu_seconds(pids), redis_cpu(client)
                rate = r["requests"] / r["seconds"]
                best[workers] = max(best.get(workers, 0.0), rate)
                bad = r["errors"] + r["non2xx"] + abs((n1 - n0) - r["requests"])
                print(f"{workers:>4} {conns:>6} {rate:>11.0f} {r['p50_ms']:>9.2f} {r['p99_ms']:>8.2f} "
                      f"{r['max_ms']:>8.1f} {bad:>7}  | {'':>19}{100 * (web1 - web0) / r['seconds']:>5.0f} "
                      f"{100 * (redis1 - redis0) / r['seconds']:>7.0f} {100 * r['wrk_cpu'] / r['seconds']:>5.0f}")  # fmt: skip
                if r["errors"] or r["non2xx"] or (n1 - n0) != r["requests"]:
                    print(f"       ! wrk: {r['errors']} socket errors, {r['non2xx']} non-2xx; Redis counted "
                          f"{n1 - n0} admissions for {r['requests']} answered requests")  # fmt: skip
            if workers == args.workers[0]:
                commands_per_submit(client, settings.effective_redis_url, port)
            if web.poll() is not None:
                print(f"  ! onelane web exited:\n{tail(log)}")
    for workers, rate in best.items():
        print(f"best with --workers {workers}: {rate:.0f} submits/s")
    client.close()


def commands_per_submit(client: redis.Redis, url: str, port: int, n: int = 5) -> None:
    """The Redis commands behind one submit, from MONITOR over `n` sequential submits."""
    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    sentinel = f"bench-monitor-end-{random.random()}"

    def watch() -> None:
        monitor_client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10)
        with monitor_client.monitor() as m:
            ready.set()
            for _ in range(100 * n + 100):  # bounded: a submit costs far fewer commands
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
    for _ in range(n):
        status, _ = http_request(port, "POST", "/v1/jobs", BODY.encode())
        assert status == 202
    time.sleep(0.2)
    client.echo(sentinel)
    thread.join(15)
    top = [c for c in seen if c.get("client_type") != "lua"]
    lua = [c for c in seen if c.get("client_type") == "lua"]
    names = Counter(c["command"].split(" ", 1)[0].upper() for c in top)
    print(f"Redis commands per submit (MONITOR, {n} sequential submits): {len(top) / n:.1f} sent by the web "
          f"({', '.join(f'{k} x{v / n:g}' for k, v in names.most_common())}), "
          f"{len(lua) / n:.1f} more run inside Lua scripts")  # fmt: skip
    per = len(top) // n
    if per:
        print("  one submit, in order: " + " | ".join(c["command"].split(" ", 1)[0].upper() + (
            " " + c["command"].split(" ")[1][:40] if c["command"].upper().startswith(('"EVALSHA', 'EVALSHA')) else "")
            for c in top[:per]))  # fmt: skip


def fill_part(args: argparse.Namespace, settings: Any) -> None:
    client = connect(settings.effective_redis_url)
    client.flushall()
    s = settings.model_copy(update={"max_queue": BOUND, "max_queued_per_user": BOUND})
    store = Store(client, s)
    print(f"\n=== {args.jobs:,} waiting jobs admitted through the admit script, {args.owners} owners, "
          f"pipelines of {args.batch} ===")  # fmt: skip
    specs = [
        JobSpec(owner=f"user{u:03d}", model=s.model_name, prompt="hi", params=SamplingParams(max_tokens=8)).model_dump_json()
        for u in range(args.owners)
    ]
    script = store._scripts["admit"]
    prefixes = keys.prefixes()
    sample_at = set(random.Random(7).sample(range(args.jobs), min(args.lookups, args.jobs)))
    sampled: dict[int, str] = {}
    mem0 = int(client.info("memory")["used_memory"])
    cpu0 = redis_cpu(client)
    started = last = time.perf_counter()
    deadline = started + args.fill_timeout
    done = 0
    while done < args.jobs and time.perf_counter() < deadline:
        size = min(args.batch, args.jobs - done)
        pipe = client.pipeline(transaction=False)
        for i in range(done, done + size):
            job_id = new_job_id()
            if i in sample_at:
                sampled[i] = job_id
            owner = i % args.owners
            script(keys=[], args=[*prefixes, job_id, f"user{owner:03d}", specs[owner], s.job_ttl_s, s.result_ttl_s, 0,
                                  s.max_queue, s.max_queued_per_user], client=pipe)  # fmt: skip
        results = pipe.execute()
        bad = [r for r in results if r[0] != "ok"]
        if bad:
            raise RuntimeError(f"admission refused: {bad[:3]}")
        done += size
        if done % args.progress == 0 or done == args.jobs:
            now = time.perf_counter()
            print(f"  {done:>9,} admitted  {now - started:6.1f} s  {args.progress / (now - last):>8,.0f} jobs/s "
                  f"(this step)")  # fmt: skip
            last = now
    elapsed = time.perf_counter() - started
    redis_busy = redis_cpu(client) - cpu0
    mem1 = int(client.info("memory")["used_memory"])
    waiting = store.waiting()
    if done < args.jobs:
        print(f"  ! stopped at the {args.fill_timeout:g} s bound with {done:,} admitted")
    print(f"fill: {done:,} jobs in {elapsed:.1f} s = {done / elapsed:,.0f} admissions/s "
          f"(Redis CPU {100 * redis_busy / elapsed:.0f} % of one core, {1e6 * redis_busy / done:.1f} us per admit)")  # fmt: skip
    print(f"waiting (ZCARD onelane:waiting) = {waiting:,}, queue = {client.zcard(keys.QUEUE):,}, "
          f"keys = {client.dbsize():,}")  # fmt: skip
    print(f"Redis used_memory: before {mem0 / 2**20:.1f} MiB, after {mem1 / 2**20:.1f} MiB -> "
          f"{(mem1 - mem0) / done:.0f} bytes per waiting job")  # fmt: skip
    one = next(iter(sampled.values()))
    print(f"  one job's keys: record {client.memory_usage(keys.job(one))} B (MEMORY USAGE), spec "
          f"{len(specs[0])} B of JSON; sorted sets QUEUE + WAITING + its owner's queue hold it too")  # fmt: skip

    # position lookups for random waiting jobs
    jobs = {i: store.get(job_id) for i, job_id in sampled.items() if i < done}
    order = list(jobs.items())
    random.Random(11).shuffle(order)
    standing, raw, zrank = [], [], []
    wrong = 0
    for i, job in order:
        t0 = time.perf_counter()
        st = store.standing(job)
        t1 = time.perf_counter()
        store._run("position", job.id)
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
    stats = client.info("commandstats")
    evalsha = stats.get("cmdstat_evalsha", {})
    print(f"  Redis commandstats: EVALSHA {evalsha.get('calls')} calls, {evalsha.get('usec_per_call')} us per call "
          f"(admit and position together)")  # fmt: skip
    client.flushall()
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=15.0)
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
