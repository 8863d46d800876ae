"""A job through onelane vs the same prompt through the engine alone, in one process.

Direct: `Engine.generate` in this process (mlx-lm's BatchGenerator with one sequence: the same tokens, seeded,
as through the stack): time to the first token that shows as text, and to the end. Through onelane: the real stack (`onelane web` under gunicorn, a `python -m worker.main`
process, Redis), one client streaming `POST /v1/chat/completions` over a plain, kept-alive socket (no client
library to pay for): time from sending the request to the first content delta, and to `[DONE]`; plus the job's own
generation time (started_at -> finished_at, Redis's clock).

The two alternate, run by run, each after the same idle pause (`--pause`), so both start from the same
state (a CPU that idled is slower to the first token than one in a hot loop) and drift hits both alike.
The figures are medians of the per-run values and of the paired differences. Both with OpenBLAS preloaded
when available (as onelane's workers run).
Run: ./dev.sh bench overhead [--runs 30] [--tokens 200] [--pause 0.1]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

from bench._load import free_port, onelane_web, stop_group, web_env
from bench.common import bench_env
from tasks.job import JobSpec, Message, SamplingParams
from tasks.store import Store, connect
from worker.blas import worker_env

SEED = 7  # the same sampled tokens both ways (the random demo model at temperature 0 can emit bytes that
# decode to no text for a long while, which would hide the first token from a client)
PROMPT = "hello"


def direct_run(engine, spec: JobSpec) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    first = None
    for chunk in engine.generate(spec):
        if first is None and chunk.text:  # the first token that shows as text, as a client sees it
            first = time.perf_counter() - started
    return (first if first is not None else float("nan")), time.perf_counter() - started


def onelane_run(sock: socket.socket, request: bytes, store: Store) -> tuple[float, float, float]:
    """One streaming request on a kept-alive connection (as API clients pool them): (first content, [DONE],
    the job's generation time). Reads the response to the end of its chunked body."""
    received = b""
    first = total = None
    started = time.perf_counter()
    sock.sendall(request)
    while not received.endswith(b"\r\n0\r\n\r\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError(f"the stream ended early: {received[-300:]!r}")
        received += chunk
        if first is None and b'"content":"' in received.replace(b'"content":""', b""):
            first = time.perf_counter() - started
        if total is None and b"data: [DONE]" in received:
            total = time.perf_counter() - started
    assert total is not None, "the body ended without [DONE]"
    job_id = received.split(b"x-onelane-job-id: ", 1)[1].split(b"\r\n", 1)[0].decode()
    t = store.get(job_id).timings
    return (first if first is not None else float("nan")), total, t.finished_at - t.started_at  # type: ignore[operator]


def chat_request(port: int, model: str, tokens: int) -> bytes:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens,
                       "stream": True, "ignore_eos": True, "temperature": 1.0, "seed": SEED}).encode()  # fmt: skip
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")  # fmt: skip
    return head.encode() + body


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--pause", type=float, default=0.1, help="idle seconds before every run, both ways")
    args = parser.parse_args()
    env = worker_env(dict(os.environ))
    if env.get("LD_PRELOAD") != os.environ.get("LD_PRELOAD"):  # measure direct generation as workers run it
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    from worker.engine import Engine

    with bench_env("tiny", max_queue=1000, max_queued_per_user=1000) as settings:
        params = SamplingParams(max_tokens=args.tokens, ignore_eos=True, temperature=1.0, seed=SEED)
        spec = JobSpec(owner="b", model="m", messages=(Message(role="user", content=PROMPT),), params=params)
        engine = Engine.load(settings.model_path)
        store = Store(connect(settings.effective_redis_url), settings)
        log = settings.var_dir / "worker.log"
        worker = subprocess.Popen([sys.executable, "-m", "worker.main"], env=web_env(settings), stdout=open(log, "wb"),
                                  stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        d_first, d_total, o_first, o_total, o_gen = [], [], [], [], []
        try:
            port = free_port()
            with onelane_web(settings, port, 1, settings.var_dir / "web.log"):
                deadline = time.monotonic() + 60
                while not store.snapshot().workers:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the worker never took the device")
                    time.sleep(0.05)
                request = chat_request(port, settings.model_name, args.tokens)
                sock = socket.create_connection(("127.0.0.1", port))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for n in range(args.runs + 1):
                    time.sleep(args.pause)
                    first, total = direct_run(engine, spec)
                    time.sleep(args.pause)
                    o = onelane_run(sock, request, store)
                    if n == 0:
                        continue  # warm-up
                    d_first.append(first)
                    d_total.append(total)
                    o_first.append(o[0])
                    o_total.append(o[1])
                    o_gen.append(o[2])
        finally:
            stop_group(worker, "worker")

    med = statistics.median
    ms = 1000

    def paired(a: list[float], b: list[float]) -> float:
        return med([x - y for x, y in zip(a, b)])

    print(f"tiny demo model, {args.tokens} tokens, chat prompt, {args.runs} alternating runs after {args.pause:g} s idle "
          f"each, load average {os.getloadavg()[0]:.2f}; medians (paired difference)")  # fmt: skip
    print(f"time to first token: direct {med(d_first) * ms:.2f} ms, through onelane (SSE) {med(o_first) * ms:.2f} ms "
          f"-> {paired(o_first, d_first) * ms:+.2f} ms")  # fmt: skip
    extra = paired(o_total, d_total)
    print(f"whole job:           direct {med(d_total) * ms:.1f} ms, through onelane end to end {med(o_total) * ms:.1f} ms "
          f"-> {extra * ms:+.1f} ms ({extra / med(d_total) * 100:+.1f} %)")  # fmt: skip
    print(f"generation alone (started -> finished in Redis): {med(o_gen) * ms:.1f} ms -> "
          f"{paired(o_gen, d_total) * ms:+.1f} ms vs direct")  # fmt: skip
    print("targets: extra time <= 2 % and <= 5 ms; first token <= direct + 5 ms")


if __name__ == "__main__":
    main()
