"""Where the time goes under streaming chat load (issue 33's first point), on the real stack as `onelane up` runs it:
Redis (with its AOF), `onelane web` under gunicorn, and a supervisor keeping an active worker and a standby.

    ./dev.sh bench profile_queue --model smollm2 --clients 8 --rounds 16     # the full run (a quiet machine)
    ./dev.sh bench profile_queue --model demo --clients 4 --rounds 4         # a smoke run

`--clients` closed-loop clients each stream `--rounds` chat requests (`--plain`: ask for them whole, as most API
clients do; their tokens are then written in quiet windows, worker/output.py) (POST /v1/chat/completions, "stream": true,
openai_load's prompts, natural stops, `--max-tokens` 32, greedy so that the bare engine makes the very same
tokens), each on a fresh connection, after one untimed round to warm up. The prefix cache is off unless
`--prefix-cache`, so both sides read the same prompt tokens. Printed, from this one run:

1. CPU seconds per 1,000 generated tokens, per process and thread: the worker's generation thread (dramatiq's
   worker thread, which runs the batch), its other threads by name (output, heartbeat, listener, consumer,
   housekeeping, ...; `unnamed` are native threads: BLAS, MLX), the standby worker, the supervisor, the web (every
   gunicorn process), Redis, and this process's clients; from /proc/<pid>/task/<tid>/stat before and after the load.
2. The step time with and without the queue around the engine: the worker's own steps (worker/timeline.py: the
   engine's step, the rest of the step in Python, the gap to the next step) against the same prompts, in the same
   order, driven straight through worker/batch/engine.py's Engine in this process, `--clients` at a time (one joins the
   moment one ends), once the stack is stopped; per-step ms by batch size, and the queue efficiency: the stack's
   tokens/s over the bare engine's. Then a client's slot between two of its jobs (last token -> its end in Redis
   -> [DONE] -> the next request -> admitted -> claimed -> joined): what keeps the batch below the clients' number.
3. For the jobs admitted while others decode (and for all): admission to first token, in parts: request->admitted
   (the web), admitted->claimed (queued_at->started_at), claimed->joined (the worker measures and inserts it),
   joined->first token (its prefill), first token->sent (the hand-over to the output thread), sent->in Redis
   (append.lua's first_token_at), in Redis->seen by the client (pub/sub, the web, HTTP); p50 and p90 of each.

The worker runs as `python -m bench.profile_queue --child worker` under `--child supervisor`: worker/main.py's run()
with worker/timeline.py recording, which it writes to its var folder as it stops. Clocks: time.time() everywhere
(Redis's TIME is the same clock on one machine).
"""

from __future__ import annotations

import argparse
import bisect
import http.client
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import (
    add_model_option,
    at_once,
    free_port,
    model_folder,
    onelane_env,
    onelane_web,
    poll_until,
    spawn,
)
from bench.openai_load import PROMPTS, contents, sse_payloads
from bench.proc import children, descendants, machine_busy, proc_cpu, thread_cpu
from bench.report import pct
from tasks.settings import Settings
from tasks.store import Store

TIMEOUT_S = 120.0

# --- the stack ---------------------------------------------------------------------------------------------------


@dataclass
class Stack:
    settings: Settings
    port: int
    web: int  # pids
    supervisor: int
    redis: int
    store: Store

    def pids(self) -> dict[str, list[int]]:
        """The processes to account, by role (the active worker is the one with a generation thread)."""
        workers = children(self.supervisor)
        active = [p for p in workers if any(n == "generation" for n, _ in thread_cpu(p).values())]
        return {
            "worker": active,
            "standby worker": [p for p in workers if p not in active],
            "supervisor": [self.supervisor],
            "web (gunicorn, all processes)": descendants(self.web),
            "redis": [self.redis],
            "bench clients (this process)": [os.getpid()],
        }


@contextmanager
def stack(settings: Settings, extra: dict[str, str]) -> Iterator[Stack]:
    """Redis, the web and the supervised worker, as `onelane up` runs them; stopped on exit."""
    from tasks.embedded_redis import EmbeddedRedis

    folder = settings.var_dir
    server = EmbeddedRedis(folder / "redis").start()  # with its AOF, as onelane up's
    try:
        settings = settings.model_copy(update={"redis_url": server.url})
        store = Store.connect(settings)
        env = onelane_env(settings, **extra)
        port = free_port()
        sup_args = [sys.executable, "-m", "bench.profile_queue", "--child", "supervisor"]
        with (
            spawn(sup_args, folder / "worker.log", env) as sup,
            onelane_web(settings, port, folder / "web.log", **extra) as web,
        ):
            if not poll_until(lambda: store.readings.snapshot().workers, 300, every_s=0.1):
                raise RuntimeError("the worker never took the device; see " + str(folder / "worker.log"))
            redis_pid = int(store.redis.info("server")["process_id"])
            yield Stack(settings, port, web.pid, sup.pid, redis_pid, store)
    finally:
        server.stop()


def child(role: str, supervisor: int | None) -> None:
    """`--child supervisor`: worker/supervisor.py's, starting `--child worker`s; `--child worker`: worker/main.py's
    run() with worker/timeline.py recording, written to ONELANE_VAR_DIR/timeline-<pid>.json as it stops."""
    from tasks.settings import LOG_FORMAT

    settings = Settings.from_env()
    logging.basicConfig(level=settings.log_level, format=LOG_FORMAT)
    if role == "supervisor":
        from worker.supervisor import Supervisor

        me = [sys.executable, "-m", "bench.profile_queue", "--child", "worker", "--supervisor", str(os.getpid())]
        sup = Supervisor(settings, command=me)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: sup.stopping.set())
        sup.run()
        return
    from worker import timeline
    from worker.blas import preload_openblas
    from worker.main import run

    preload_openblas()
    timeline.record()
    run(settings, supervisor=supervisor)
    if timeline.marks:
        out = settings.var_dir / f"timeline-{os.getpid()}.json"
        out.write_text(json.dumps({"marks": timeline.marks, "steps": timeline.steps}))


# --- the load ----------------------------------------------------------------------------------------------------


@dataclass
class Request:
    prompt: str
    client: int = 0
    sent: float = 0.0  # time.time()
    first: float | None = None  # the first content delta
    done: float | None = None
    job_id: str | None = None
    tokens: int = 0
    error: str | None = None


def stream(port: int, model: str, r: Request, max_tokens: int, plain: bool = False) -> Request:
    """One streamed chat completion on a fresh connection, read as it arrives (`plain`: one asked for whole)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": r.prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **({} if plain else {"stream": True, "stream_options": {"include_usage": True}}),
    }
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        r.sent = time.time()
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        r.job_id = resp.getheader("x-onelane-job-id")
        if resp.status != 200:
            r.error = f"http {resp.status}"
            return r
        if plain:
            r.tokens = int(json.loads(resp.read())["usage"]["completion_tokens"])
            r.done = time.time()
            return r
        for payload in sse_payloads(resp):
            if payload == b"[DONE]":
                r.done = time.time()
                break
            chunk = json.loads(payload)
            if r.first is None and contents(chunk):
                r.first = time.time()
            r.tokens = int((chunk.get("usage") or {}).get("completion_tokens", r.tokens))
        if r.done is None:
            r.error = "ended without [DONE]"
    except (OSError, http.client.HTTPException, ValueError) as exc:
        r.error = type(exc).__name__
    finally:
        conn.close()
    return r


def closed_loop(
    s: Stack, clients: int, rounds: int, max_tokens: int, offset: int = 0, plain: bool = False
) -> list[Request]:
    """`clients` clients at once, each streaming `rounds` requests back to back (`plain`: asking for them whole)."""

    def client(c: int) -> list[Request]:
        prompts = [PROMPTS[(offset + c * rounds + i) % len(PROMPTS)] for i in range(rounds)]
        return [stream(s.port, s.settings.model_name, Request(p, c), max_tokens, plain) for p in prompts]

    return [r for mine in at_once(clients, client) for r in mine]


# --- CPU by thread -----------------------------------------------------------------------------------------------


Snapshot = dict[str, dict[tuple[int, int], tuple[str, float]]]
GONE = "ended threads (and /proc's tick rounding)"


def cpu_snapshot(roles: dict[str, list[int]]) -> Snapshot:
    """Per role, each thread's (pid, tid) -> (name, CPU seconds so far), and each process's own total (pid, 0)."""
    out: Snapshot = {}
    for role, pids in roles.items():
        out[role] = {(pid, 0): ("", proc_cpu(pid) or 0.0) for pid in pids}
        for pid in pids:
            for tid, (name, cpu) in thread_cpu(pid).items():
                label = name if tid != pid else "main" if pid == pids[0] else "main threads of child processes"
                if label != "main" and label in _exe_names(pid):  # nobody named it: a native thread (BLAS, MLX)
                    label = "unnamed (native: BLAS, MLX)"
                out[role][(pid, tid)] = (label, cpu)
    return out


def cpu_used(before: Snapshot, after: Snapshot) -> dict[str, dict[str, float]]:
    """Per role, per thread name, the CPU seconds used between the two snapshots; what the processes used beyond
    their live threads' is GONE's (a thread that ended keeps its time in its process's total)."""
    used: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for role, threads in after.items():
        for key, (name, cpu) in threads.items():
            delta = cpu - before.get(role, {}).get(key, (name, 0.0))[1]
            used[role][name or GONE] += delta if name else 0.0
            if not name:  # the process's total: what its live threads do not explain went to ended ones
                used[role][GONE] += delta - sum(
                    c - before[role].get(k, ("", 0.0))[1] for k, (_, c) in threads.items() if k[0] == key[0] and k[1]
                )
    return used


def _exe_names(pid: int) -> set[str]:
    """The names an unnamed thread of `pid` has: its process's."""
    try:
        return {Path(f"/proc/{pid}/comm").read_text().strip(), "python", "python3"}
    except OSError:
        return {"python", "python3"}


# --- the bare engine ---------------------------------------------------------------------------------------------


@dataclass
class Bare:
    tokens: int = 0
    wall_s: float = 0.0
    steps: list[tuple[float, int, int]] = field(default_factory=list)  # (seconds, sequences, prompt tokens read)


def bare_engine(settings: Settings, prompts: list[str], clients: int, max_tokens: int) -> Bare:
    """The same prompts, in the same order, straight through the Engine: `clients` at a time, the next one joining
    the moment one ends."""
    from tasks.job import JobSpec, Message, SamplingParams
    from worker.batch.engine import Engine

    engine = Engine.load(settings.model_path)
    engine.configure(settings.max_batch, settings.prefill_step)
    params = SamplingParams(max_tokens=max_tokens, temperature=0)

    def insert(text: str) -> int:
        spec = JobSpec(owner="b", model="m", messages=(Message(role="user", content=text),), params=params)
        return engine.insert(engine.prompt_tokens(spec), params)

    def run(texts: list[str], out: Bare) -> None:
        waiting, live = list(texts), 0
        started = time.perf_counter()
        with engine.lock:
            while waiting or live:
                while waiting and live < clients:
                    insert(waiting.pop(0))
                    live += 1
                t0 = time.perf_counter()
                tokens = engine.step()
                out.steps.append((time.perf_counter() - t0, len(tokens), engine.padded_prefill))
                out.tokens += len(tokens)
                live -= sum(1 for t in tokens if t.finish_reason)
        out.wall_s = time.perf_counter() - started

    run(prompts[:clients], Bare())  # warm up, as the stack was
    bare = Bare()
    run(prompts, bare)
    return bare


# --- report ------------------------------------------------------------------------------------------------------


def p50_p90(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{pct(values, 50) * 1000:7.1f} / {pct(values, 90) * 1000:7.1f}"


def report_cpu(used: dict[str, dict[str, float]], tokens: int, wall: float, machine: float) -> None:
    print(f"\n== 1. CPU per 1,000 generated tokens ({tokens} tokens in {wall:.2f} s)")
    print(f"  {'process / thread':46} {'CPU s':>8} {'s / 1k tok':>11} {'cores':>6}")
    ours = 0.0
    for role, threads in used.items():
        total = sum(threads.values())
        ours += total
        print(f"  {role:46} {total:8.2f} {total / tokens * 1000:11.3f} {total / wall:6.2f}")
        for name, cpu in sorted(threads.items(), key=lambda kv: -kv[1]):
            if len(threads) > 1 and cpu >= 0.0005:
                print(f"    {name:44} {cpu:8.3f} {cpu / tokens * 1000:11.3f} {cpu / wall:6.3f}")
    print(f"  {'all of the above':46} {ours:8.2f} {ours / tokens * 1000:11.3f} {ours / wall:6.2f}")
    other = machine - ours
    print(f"  {'the rest of the machine (not this run)':46} {other:8.2f} {'':11} {other / wall:6.2f}")


def report_steps(steps: list[list[float]], bare: Bare, tokens: int, wall: float, clients: int) -> None:
    print("\n== 2. steps with and without the queue around the engine")
    eng = [s[1] - s[0] for s in steps]
    rest = [s[2] - s[1] for s in steps]
    gaps = [b[0] - a[2] for a, b in zip(steps, steps[1:])]
    idle = sum(g for g in gaps if g >= 0.5)
    busy = [g for g in gaps if g < 0.5]
    print(
        f"  stack, generation loop over the load's {wall:.2f} s: engine steps {sum(eng):.2f} s, the rest of each step "
        f"(Python: texts, endings) {sum(rest):.2f} s, between steps (claims, settling, drops) {sum(busy):.2f} s, "
        f"idle gaps >= 0.5 s {idle:.2f} s; {len(steps)} steps"
    )
    stack_rate, bare_rate = tokens / wall, bare.tokens / bare.wall_s
    occ = statistics.fmean(s[3] for s in steps) if steps else 0.0
    bare_occ = statistics.fmean(n for _, n, _ in bare.steps) if bare.steps else 0.0
    print(
        f"  tokens/s: stack {stack_rate:.1f} ({tokens} tokens, {wall:.2f} s), bare engine {bare_rate:.1f} "
        f"({bare.tokens} tokens, {bare.wall_s:.2f} s); queue efficiency {stack_rate / bare_rate:.3f}x"
    )
    print(f"  mean sequences per step: stack {occ:.2f}, bare {bare_occ:.2f} (of {clients} clients)")
    print("  per step, ms p50 / p90 by sequences that got a token (decode-only steps | steps that read a prompt):")
    print(f"  {'n':>3} {'stack engine':>17} {'stack loop':>17} {'bare engine':>17}   (steps: stack / bare)")
    loop = [b[0] - a[0] for a, b in zip(steps, steps[1:])] + [float("nan")]
    for prefill in (False, True):
        print(f"  -- {'with prefill' if prefill else 'decode only'}")
        sizes = sorted(
            {int(s[3]) for s in steps if (s[4] > 0) == prefill} | {n for _, n, p in bare.steps if (p > 0) == prefill}
        )
        for n in sizes:
            picked = [i for i, s in enumerate(steps) if int(s[3]) == n and (s[4] > 0) == prefill]
            se = [eng[i] for i in picked]
            sl = [loop[i] for i in picked if loop[i] == loop[i] and loop[i] < 0.5]
            be = [t for t, k, p in bare.steps if k == n and (p > 0) == prefill]
            print(f"  {n:3d} {p50_p90(se):>17} {p50_p90(sl):>17} {p50_p90(be):>17}   ({len(se)} / {len(be)})")


PARTS = (
    ("request -> admitted (web)", "sent", "queued_at"),
    ("admitted -> claimed", "queued_at", "started_at"),
    ("claimed -> joined the engine", "started_at", "joined"),
    ("joined -> first token (prefill step)", "joined", "first_token"),
    ("first token -> sent (hand-over to the output thread)", "first_token", "sent_w"),
    ("sent -> in Redis (append.lua's first_token_at)", "sent_w", "first_token_at"),
    ("in Redis -> seen by the client (pub/sub, web, HTTP)", "first_token_at", "first"),
    ("= time to first token, client", "sent", "first"),
    ("(in Redis -> its reply seen by the output thread)", "first_token_at", "written"),
)


REFILL = (
    ("last token -> ended in Redis (finished_at)", "last_step", "finished_at"),
    ("ended in Redis -> [DONE] seen by the client", "finished_at", "done"),
    ("[DONE] -> next request sent", "done", "next_sent"),
    ("next sent -> admitted", "next_sent", "next_queued_at"),
    ("admitted -> claimed", "next_queued_at", "next_started_at"),
    ("claimed -> joined the engine", "next_started_at", "next_joined"),
    ("= a client's slot empty (last token -> next joined)", "last_step", "next_joined"),
)


def report_refill(
    requests: list[Request], jobs: dict[str, Any], marks: dict[str, dict[str, float]], steps: list[list[float]]
) -> None:
    """Why the batch runs below the clients' number: from a job's last token to its client's next job joining."""
    print("\n  a client's slot between two of its jobs, ms p50 / p90 (occupancy lost to the round trip):")
    last_step: dict[str, float] = {}
    ends = sorted(st[1] for st in steps)
    points = []
    by_client: dict[int, list[Request]] = defaultdict(list)
    for r in sorted(requests, key=lambda r: r.sent):
        by_client[r.client].append(r)
    for rs in by_client.values():
        for r, nxt in zip(rs, rs[1:]):
            job, nj = jobs.get(r.job_id or ""), jobs.get(nxt.job_id or "")
            if job is None or nj is None or job.timings.finished_at is None or r.done is None:
                continue
            t, nt = job.timings, nj.timings
            # its last token: the last step that ended before the job's end was recorded
            i = max(0, bisect.bisect_right(ends, t.finished_at) - 1)
            last_step[job.id] = ends[i] if ends else t.finished_at
            p = {
                "last_step": last_step[job.id],
                "finished_at": t.finished_at,
                "done": r.done,
                "next_sent": nxt.sent,
                "next_queued_at": nt.queued_at,
                "next_started_at": nt.started_at,
                "next_joined": marks.get(nj.id, {}).get("joined"),
            }
            points.append({k: v for k, v in p.items() if v is not None})
    for name, a, b in REFILL:
        values = [p[b] - p[a] for p in points if a in p and b in p]
        if values:
            print(f"  {name:52} {p50_p90(values)}   (n={len(values)})")


def report_ttft(amid: list[dict[str, float]], points: list[dict[str, float]]) -> None:
    print(
        f"\n== 3. admission to first token, ms p50 / p90: the {len(amid)} jobs admitted while others decoded | all {len(points)}"
    )
    for name, a, b in PARTS:
        values = [p[b] - p[a] for p in amid if a in p and b in p]
        every = [p[b] - p[a] for p in points if a in p and b in p]
        if every:
            print(f"  {name:52} {p50_p90(values):>17} | {p50_p90(every):>17}")


def ttft_points(
    requests: list[Request], jobs: dict[str, Any], marks: dict[str, dict[str, float]]
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Each job's points (client, Redis, worker), for those admitted while another job was generating."""
    points = []
    for r in requests:
        job = jobs.get(r.job_id) if r.job_id else None
        if job is None or r.first is None:
            continue
        t = job.timings
        m = marks.get(job.id, {})
        p = {"sent": r.sent, "first": r.first, "queued_at": t.queued_at, "started_at": t.started_at}
        p |= {"first_token_at": t.first_token_at, "finished_at": t.finished_at}
        p |= {k: v for k, v in m.items() if k != "sent"} | ({"sent_w": m["sent"]} if "sent" in m else {})
        points.append({k: v for k, v in p.items() if v is not None})
    decoding = [(p["first_token_at"], p["finished_at"]) for p in points if "first_token_at" in p and "finished_at" in p]
    amid = [p for p in points if any(a <= p["queued_at"] < b for a, b in decoding)]
    return amid, points


# --- main --------------------------------------------------------------------------------------------------------


def main() -> None:
    args = parse_args()
    if args.child:
        child(args.child, args.supervisor)
        return
    from worker.blas import preload_openblas

    preload_openblas()
    extra = {"ONELANE_MAX_QUEUE": "1000", "ONELANE_MAX_QUEUED_PER_USER": "1000"}
    if not args.prefix_cache:
        extra["ONELANE_PREFIX_CACHE"] = "0"
    with tempfile.TemporaryDirectory(prefix="onelane-profile-") as tmp:
        folder = Path(tmp)
        model = model_folder(args.model, folder)
        settings = Settings(model=str(model), var_dir=folder)  # type: ignore[arg-type]
        print(
            f"model {args.model}, {args.clients} clients x {args.rounds} {'plain' if args.plain else 'streamed'} chat "
            f"requests, max_tokens "
            f"{args.max_tokens}, greedy, natural stops, prefix cache {'on' if args.prefix_cache else 'off'}; "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        load = under_load(settings, args, extra)
        marks, steps = timelines(folder, load.started, load.ended)
        requests, jobs = load.requests, load.jobs
        wall = load.ended - load.started
        tokens = sum(j.usage.completion_tokens for j in jobs.values() if j is not None)
        failed = [r for r in requests if r.error]
        print(f"  {len(requests)} requests, {len(failed)} failed; client TTFT p50 / p90 {p50_p90(ttft(requests))} ms")
        report_cpu(load.used, tokens, wall, load.machine)
        # the same prompts in the same order (of admission) through the bare engine, the stack stopped
        ordered = sorted((r for r in requests if jobs.get(r.job_id)), key=lambda r: jobs[r.job_id].timings.queued_at)
        bare = bare_engine(load.settings, [r.prompt for r in ordered], args.clients, args.max_tokens)
        report_steps(steps, bare, tokens, wall, args.clients)
        report_refill(requests, jobs, marks, steps)
        report_ttft(*ttft_points(requests, jobs, marks))
        print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_option(parser)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=16, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prefix-cache", action="store_true", help="leave the prefix cache on (its default)")
    parser.add_argument("--plain", action="store_true", help="the requests ask for whole answers (not streamed)")
    parser.add_argument("--child", choices=["supervisor", "worker"], help=argparse.SUPPRESS)
    parser.add_argument("--supervisor", type=int, help=argparse.SUPPRESS)
    return parser.parse_args()


@dataclass
class Load:
    """What the stack did under the load: the requests and their jobs, the CPU used by role and thread and by the
    whole machine, when the load began and ended (time.time()), and the settings the stack ran with."""

    requests: list[Request]
    jobs: dict[str, Any]
    used: dict[str, dict[str, float]]
    machine: float
    started: float
    ended: float
    settings: Settings


def under_load(settings: Settings, args: argparse.Namespace, extra: dict[str, str]) -> Load:
    """The stack up, warmed by one round, then the clients' load with the CPU read before and after; stopped."""
    with stack(settings, extra) as s:
        closed_loop(s, args.clients, 1, args.max_tokens, offset=3)  # warm up
        roles = s.pids()
        before, busy0, started = cpu_snapshot(roles), machine_busy(), time.time()
        requests = closed_loop(s, args.clients, args.rounds, args.max_tokens, plain=args.plain)
        ended, busy1, after = time.time(), machine_busy(), cpu_snapshot(roles)
        jobs = {r.job_id: s.store.get(r.job_id) for r in requests if r.job_id}  # read before the stack stops
        return Load(requests, jobs, cpu_used(before, after), busy1 - busy0, started, ended, s.settings)


def timelines(folder: Path, started: float, ended: float) -> tuple[dict[str, dict[str, float]], list[list[float]]]:
    """The worker's marks per job and its steps during the load, from the timelines it wrote as it stopped."""
    marks: dict[str, dict[str, float]] = {}
    steps: list[list[float]] = []
    for path in folder.glob("timeline-*.json"):
        t = json.loads(path.read_text())
        marks |= t["marks"]
        steps += [st for st in t["steps"] if started <= st[0] <= ended]
    return marks, steps


def ttft(requests: list[Request]) -> list[float]:
    return [r.first - r.sent for r in requests if r.first is not None]


if __name__ == "__main__":
    main()
