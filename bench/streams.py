"""Many open event streams on one web process: `--streams` SSE clients on `onelane web --workers 1`.

No worker runs, so every admitted job waits and its stream stays open with position updates and pings
(ONELANE_SSE_PING_S=`--ping`). The client is this process: one gevent greenlet per stream on a plain
HTTP/1.1 socket that only reads (chunked transfer decoded, SSE parsed), timestamps taken as bytes arrive.

Two runs: REDIS_URL as onelane gets it, then the same URL with `?max_connections=N` (redis-py's connection
pool bound, which defaults to 100 and caps how many streams one web process can hold). Each prints: streams
opened and still open after the hold, pings per stream, the gunicorn worker's VmRSS and open descriptors
before and while holding them (and per stream), Redis connected_clients, the CPU of the web worker while
holding them, and for `--moves` cancels of the job at the head (DELETE /v1/jobs/<id>) how long the new
position took to reach every other stream as a `queued` event (p50/p99/max over streams, slowest per move),
and the web log's warnings and errors.

Run: .venv/bin/python -m bench.streams [--streams 500] [--hold 20] [--moves 5]
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()  # before anything opens a socket: the client is gevent greenlets

import argparse
import json
import re
import resource
import socket
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent

from bench.harness import bench_env, free_port, http_request, matching_lines, onelane_web, queue_bounds, tail
from bench.proc import children, cpu_now, open_fds, rss_kb
from bench.report import pct
from tasks.events import TERMINAL
from tasks.settings import Settings
from tasks.store import Store

BOUND = 10_000_000
BODY = b'{"prompt":"hi","max_tokens":8}'


@dataclass
class Stream:
    job_id: str
    status: int = 0
    opened_at: float | None = None  # response headers received
    closed_at: float | None = None
    error: str | None = None
    pings: list[float] = field(default_factory=list)
    queued: list[tuple[float, int]] = field(default_factory=list)  # (arrival, position)
    others: list[tuple[float, str]] = field(default_factory=list)  # (arrival, event type)
    stop: bool = False

    @property
    def position(self) -> int | None:
        return self.queued[-1][1] if self.queued else None

    @property
    def open(self) -> bool:
        return self.opened_at is not None and self.closed_at is None and self.error is None


def follow_stream(port: int, stream: Stream, deadline: float, read_timeout: float) -> None:
    """GET /v1/jobs/<id>/events and record every event until a terminal one, `stop`, an error or `deadline`."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        raw, chunked = open_stream(sock, stream, read_timeout)
        text = ""  # de-chunked SSE text not yet parsed
        ended = False
        while not ended and not stream.stop and time.monotonic() < deadline:
            body, raw, ended = dechunk(raw, chunked)
            text, terminal = take_events(stream, text + body, time.monotonic())
            ended = ended or terminal
            if ended:
                break
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("closed by the server")
            raw += data
        stream.closed_at = time.monotonic() if ended else None
    except Exception as exc:  # noqa: BLE001 - recorded and reported
        stream.error = f"{type(exc).__name__}: {exc}"
    finally:
        sock.close()


def open_stream(sock: socket.socket, stream: Stream, read_timeout: float) -> tuple[bytes, bool]:
    """Send the GET and read the response's head: (what came after it, whether the body is chunked)."""
    sock.sendall(
        f"GET /v1/jobs/{stream.job_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    sock.settimeout(read_timeout)
    raw = b""
    while b"\r\n\r\n" not in raw:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed before the response headers")
        raw += data
    head, raw = raw.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    stream.status = int(lines[0].split()[1])
    chunked = any(ln.lower().replace(" ", "") == "transfer-encoding:chunked" for ln in lines[1:])
    if stream.status != 200:
        raise ConnectionError(f"HTTP {stream.status}")
    stream.opened_at = time.monotonic()
    return raw, chunked


def dechunk(raw: bytes, chunked: bool) -> tuple[str, bytes, bool]:
    """The text of the complete chunks `raw` holds, what is left of it, and whether the body ended (its 0 chunk)."""
    if not chunked:
        return raw.decode(), b"", False
    text = ""
    while (end := raw.find(b"\r\n")) >= 0:
        size = int(raw[:end].split(b";")[0], 16)
        if len(raw) < end + 2 + size + 2:
            break
        if size == 0:
            return text, raw, True
        text += raw[end + 2 : end + 2 + size].decode()
        raw = raw[end + 2 + size + 2 :]
    return text, raw, False


def take_events(stream: Stream, text: str, now: float) -> tuple[str, bool]:
    """Record the complete SSE events in `text` (arrived `now`): (the rest of it, whether an event was terminal)."""
    ended = False
    while "\n\n" in text:
        block, text = text.split("\n\n", 1)
        kind, data = "message", ""
        for line in block.split("\n"):
            if line.startswith(": ping"):
                stream.pings.append(now)
            elif line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        if not data:
            continue
        if kind == "queued":
            stream.queued.append((now, int(json.loads(data)["position"])))
        else:
            stream.others.append((now, kind))
            ended = ended or kind in TERMINAL
    return text, ended


def report_log(log: Path) -> None:
    """The web's warnings and errors, each distinct message once with its count."""
    seen: Counter[str] = Counter()
    for line in matching_lines(log, (" WARNING ", " ERROR ", "Traceback", "Error")):
        seen[re.sub(r"job_[A-Za-z0-9_-]+|\d{4}-\d\d-\d\d [\d:,]+ \d+ ", "", line)[:300]] += 1
    if seen:
        print(f"web log: {sum(seen.values())} warning/error lines, {len(seen)} distinct:")
        for message, count in seen.most_common(8):
            print(f"  {count:>5} x {message}")


@dataclass(frozen=True)
class Sample:
    """The web worker, Redis, this process (the streams' client) and the machine at one moment."""

    at: float
    rss_kb: int
    fds: int
    redis_clients: int
    cpu: tuple[float, float, float]  # seconds so far: the web worker, Redis, the whole machine
    client_cpu: float

    @classmethod
    def take(cls, worker: int, client: Any) -> Sample:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return cls(
            time.monotonic(),
            rss_kb(worker),
            open_fds(worker),
            int(client.info("clients")["connected_clients"]),
            cpu_now([worker], client),
            usage.ru_utime + usage.ru_stime,
        )


@dataclass
class Run:
    """What one phase measured (every time a time.monotonic())."""

    admit_s: float
    before: Sample
    opened_at: float
    streams: list[Stream]
    post: tuple[int, bytes, float]  # a submit while the streams are open: status, body, ms
    get_status: int
    held: tuple[Sample, Sample, Sample]  # the hold's start, 3 s in, its end
    moves: list[list[float]]  # per move: how long each stream took to get it
    missing: int  # streams that never got a move's new position
    cancel_ms: list[float]  # how long each DELETE took
    hung_up: tuple[int, float, int]  # Redis clients once settled, after how long, the worker's VmRSS


def admit_jobs(port: int, n: int) -> list[str]:
    """n jobs, all the local user's, so their positions are 1..n in admission order."""
    ids = []
    for _ in range(n):
        status, answer = http_request(port, "POST", "/v1/jobs", BODY)
        if status != 202:
            raise RuntimeError(f"submit answered {status}: {answer[:200]!r}")
        ids.append(json.loads(answer)["id"])
    return ids


def move_queue(
    port: int, streams: list[Stream], moves_n: int, gap: float
) -> tuple[list[list[float]], int, list[float]]:
    """Cancel the head job `moves_n` times, `gap` s apart: how long each move took to reach each stream, how many
    streams it never reached, and how long each DELETE took."""
    moves: list[list[float]] = []
    missing = 0
    cancel_ms: list[float] = []
    for head in range(moves_n):
        live = [s for s in streams[head + 1 :] if s.open]
        expect = {id(s): s.position - 1 for s in live if s.position}  # type: ignore[operator]
        t0 = time.monotonic()
        status, _ = http_request(port, "DELETE", f"/v1/jobs/{streams[head].job_id}")
        cancel_ms.append((time.monotonic() - t0) * 1000)
        if status != 200:
            print(f"  ! DELETE answered {status}")
        got: dict[int, float] = {}
        limit = time.monotonic() + 10
        while time.monotonic() < limit and len(got) < len(expect):
            for s in live:
                if id(s) not in got:
                    hit = next((t for t, p in s.queued if t >= t0 and p == expect[id(s)]), None)
                    if hit is not None:
                        got[id(s)] = hit - t0
            gevent.sleep(0.02)
        missing += len(expect) - len(got)
        moves.append(sorted(got.values()))
        gevent.sleep(max(0.0, gap - (time.monotonic() - t0)))
    return moves, missing, cancel_ms


def measure(
    port: int,
    worker: int,
    client: Any,
    args: argparse.Namespace,
    hold: float,
    moves_n: int,
    greenlets: list[gevent.Greenlet],
) -> Run:
    """Admit the jobs, open a stream on each, hold them `hold` s while the queue moves `moves_n` times, hang up."""
    started = time.monotonic()
    ids = admit_jobs(port, args.streams)
    admit_s = time.monotonic() - started
    for _ in range(3):  # warm the stream path once (imports, pools) before measuring memory
        follow_stream(port, Stream(ids[-1]), time.monotonic() + 1.2, 5)
    time.sleep(1.0)
    before = Sample.take(worker, client)
    opened_at = time.monotonic()
    streams = open_streams(port, ids, args, opened_at + hold + 60, greenlets)
    post, get_status = requests_while_open(port, ids[-1])
    gevent.sleep(1.5)  # both published a queue move: let every stream look and settle

    start = Sample.take(worker, client)
    gevent.sleep(3.0)
    idle = Sample.take(worker, client)
    moves = move_queue(port, streams, moves_n, max(1.0, (hold - 5.0) / max(moves_n, 1)))
    gevent.sleep(max(0.0, hold - (time.monotonic() - start.at)))
    end = Sample.take(worker, client)
    hung_up = hang_up(streams, greenlets, client, end.redis_clients)
    return Run(
        admit_s, before, opened_at, streams, post, get_status, (start, idle, end), *moves, (*hung_up, rss_kb(worker))
    )


def open_streams(
    port: int, ids: list[str], args: argparse.Namespace, deadline: float, greenlets: list[gevent.Greenlet]
) -> list[Stream]:
    """A stream on each job, each on a greenlet of its own; back once each has its first position (or 30 s)."""
    streams = [Stream(job_id) for job_id in ids]
    greenlets += [gevent.spawn(follow_stream, port, s, deadline, max(5.0, 5 * args.ping)) for s in streams]
    limit = time.monotonic() + 30
    while time.monotonic() < limit and sum(1 for s in streams if s.queued or s.error) < args.streams:
        gevent.sleep(0.05)
    return streams


def requests_while_open(port: int, last_id: str) -> tuple[tuple[int, bytes, float], int]:
    """A submit (cancelled at once: not part of the queue below) and a GET while the streams are open."""
    t0 = time.monotonic()
    status, answer = http_request(port, "POST", "/v1/jobs", BODY)
    post = (status, answer, (time.monotonic() - t0) * 1000)
    get_status = http_request(port, "GET", f"/v1/jobs/{last_id}")[0]
    if status == 202:
        http_request(port, "DELETE", f"/v1/jobs/{json.loads(answer)['id']}")
    return post, get_status


def hang_up(streams: list[Stream], greenlets: list[gevent.Greenlet], client: Any, clients: int) -> tuple[int, float]:
    """Hang up every stream: the web should notice, close their pub/sub connections and free memory. Returns Redis's
    connected clients once they held still for 1.5 s (or 10 s passed), and after how long."""
    for s in streams:
        s.stop = True
    gevent.killall(greenlets, timeout=5)
    hung_up = time.monotonic()
    stable_since = time.monotonic()
    while time.monotonic() < hung_up + 10 and time.monotonic() - stable_since < 1.5:
        gevent.sleep(0.25)
        now_clients = int(client.info("clients")["connected_clients"])
        if now_clients != clients:
            clients, stable_since = now_clients, time.monotonic()
    return clients, stable_since - hung_up


def report(run: Run, args: argparse.Namespace) -> None:
    report_opened(run, args.streams)
    report_held(run, args)
    report_moves(run)
    clients, settled_s, rss = run.hung_up
    print(
        f"after the clients hung up: Redis connected_clients settled at {clients} {settled_s:.1f} s later, "
        f"worker VmRSS {rss / 1024:.1f} MiB"
    )


def report_opened(run: Run, n: int) -> None:
    """The streams opened, and a submit and a GET while they were."""
    streams, before = run.streams, run.before
    print(f"admitted {n} jobs in {run.admit_s:.2f} s")
    print(f"before: worker VmRSS {before.rss_kb / 1024:.1f} MiB, Redis connected_clients {before.redis_clients}")
    first = [s.queued[0][0] - run.opened_at for s in streams if s.queued]
    ok_first = sum(1 for i, s in enumerate(streams) if s.queued and s.queued[0][1] == i + 1)
    print(
        f"opened: {sum(1 for s in streams if s.opened_at)} of {n} answered 200; {len(first)} got their "
        f"first `queued` event, all within {max(first) if first else float('nan'):.2f} s of the first "
        f"connect; {ok_first} with the right position"
    )
    errors = [s.error for s in streams if s.error]
    if errors:
        print(f"  ! {len(errors)} streams failed: {sorted(set(errors))[:5]}")
    status, answer, post_ms = run.post
    print(
        f"while they are open: POST /v1/jobs answered {status} in {post_ms:.0f} ms"
        f"{' ' + answer[:120].decode(errors='replace') if status != 202 else ''}; GET /v1/jobs/<id> "
        f"answered {run.get_status}"
    )


def report_held(run: Run, args: argparse.Namespace) -> None:
    """While the streams were held: how many stayed open, their pings, and what they cost in memory and CPU."""
    start, idle, end = run.held
    before, held, head = run.before, end.at - start.at, len(run.moves)
    cancelled, rest = run.streams[:head], run.streams[head:]
    pings = [sum(1 for t in s.pings if start.at <= t <= end.at) for s in rest if s.open] or [0]
    print(
        f"held {held:.1f} s: {sum(1 for s in rest if s.open)} of {len(rest)} waiting streams still open; the {head} "
        f"cancelled jobs' streams ended with `cancelled`: "
        f"{sum(1 for s in cancelled if s.others and s.others[-1][1] == 'cancelled')} of {head}"
    )
    failed = next((s for s in rest if s.error), None)
    if failed:
        print(f"  ! {failed.job_id}: {failed.error}")
    print(
        f"pings per open stream while holding: min {min(pings)}, median {statistics.median(pings):g}, "
        f"max {max(pings)} (expected ~{held / args.ping:.0f} at one per {args.ping:g} s)"
    )
    print(
        f"worker VmRSS: before {before.rss_kb / 1024:.1f} MiB, holding {idle.rss_kb / 1024:.1f} MiB (3 s in), "
        f"{end.rss_kb / 1024:.1f} MiB (end) -> {(max(idle.rss_kb, end.rss_kb) - before.rss_kb) / args.streams:.0f} kB "
        "per stream"
    )
    print(
        f"Redis connected_clients: before {before.redis_clients}, holding {idle.redis_clients} (3 s in), "
        f"{end.redis_clients} (end, after the moves); worker open file descriptors: before {before.fds}, holding "
        f"{idle.fds} (3 s in), {end.fds} (end)"
    )
    web, redis_used, busy = (b - a for a, b in zip(start.cpu, end.cpu))
    client_cpu = end.client_cpu - start.client_cpu
    print(
        f"CPU: web worker {100 * (idle.cpu[0] - start.cpu[0]) / (idle.at - start.at):.0f} % of one core just "
        f"holding them (first 3 s, no moves), {100 * web / held:.0f} % over the whole hold with the moves; Redis "
        f"{100 * redis_used / held:.0f} %, this client {100 * client_cpu / held:.0f} %, everything else on the "
        f"machine {100 * (busy - web - client_cpu - redis_used) / held:.0f} % (2 cores = 200 %)"
    )


def report_moves(run: Run) -> None:
    """How long each move of the queue took to reach the streams."""
    flat = sorted(x for m in run.moves for x in m)
    if not flat:
        return
    print(
        f"queue moved ({len(run.moves)} cancels of the head job, DELETE answered in "
        f"{statistics.median(run.cancel_ms):.1f} ms median): new position reached "
        f"{len(flat)} of {len(flat) + run.missing} streams expected"
    )
    print(
        f"  per stream: p50 {pct(flat, 50) * 1000:.0f} ms, p99 {pct(flat, 99) * 1000:.0f} ms, "
        f"max {flat[-1] * 1000:.0f} ms (from sending the DELETE)"
    )
    print("  all streams reached, per move: " + ", ".join(f"{m[-1] * 1000:.0f} ms ({len(m)})" for m in run.moves if m))
    print("  first stream reached, per move: " + ", ".join(f"{m[0] * 1000:.0f} ms" for m in run.moves if m))


def phase(settings: Settings, args: argparse.Namespace, label: str, redis_url: str, hold: float, moves_n: int) -> None:
    """One web process, `args.streams` jobs and streams on it, held `hold` s with `moves_n` head cancels."""
    client = Store.connect(settings).redis
    client.flushall()
    port = free_port()
    log = Path(settings.var_dir) / f"web-{label}.log"
    env = {"ONELANE_SSE_PING_S": f"{args.ping:g}", "REDIS_URL": redis_url, **queue_bounds(BOUND)}
    greenlets: list[gevent.Greenlet] = []
    print(
        f"\n=== {label}: {args.streams} SSE streams on one `onelane web --workers 1` (gunicorn gevent), "
        f"REDIS_URL query: {redis_url.partition('?')[2] or 'none (redis-py defaults)'}, "
        f"ONELANE_SSE_PING_S={args.ping:g}, no GPU worker; client: gevent greenlets in this process ==="
    )
    try:
        with onelane_web(settings, port, log, 1, quiet=True, **env) as web:
            run = measure(port, children(web.pid)[0], client, args, hold, moves_n, greenlets)
            exited = web.poll() is not None
        report(run, args)
        if exited:
            print(f"  ! onelane web exited:\n{tail(log)}")
        report_log(log)
    finally:
        gevent.killall(greenlets, timeout=5)
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--hold", type=float, default=20.0, help="seconds to hold the open streams")
    parser.add_argument("--ping", type=float, default=1.0, help="ONELANE_SSE_PING_S")
    parser.add_argument("--moves", type=int, default=5, help="cancels of the head job while holding")
    parser.add_argument(
        "--max-connections",
        type=int,
        default=2000,
        help="second run: REDIS_URL with ?max_connections=N (redis-py's pool bound; its default is 100)",
    )
    parser.add_argument("--skip-default", action="store_true", help="skip the run with REDIS_URL as it is")
    args = parser.parse_args()
    wall = time.monotonic()
    with bench_env("tiny") as settings:
        url = settings.effective_redis_url
        if not args.skip_default:
            phase(settings, args, "as shipped", url, min(args.hold, 8.0), 1)
        if args.max_connections:
            bigger = f"{url}{'&' if '?' in url else '?'}max_connections={args.max_connections}"
            phase(settings, args, f"pool bound {args.max_connections}", bigger, args.hold, args.moves)
    print(f"total {time.monotonic() - wall:.0f} s")


if __name__ == "__main__":
    main()
