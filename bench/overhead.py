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
import time

from bench.harness import bench_env, free_port, generate, onelane_web, onelane_worker, poll_until
from tasks.job import JobSpec, Message, SamplingParams
from tasks.store import Store
from worker.blas import preload_openblas

SEED = 7  # the same sampled tokens both ways (the random demo model at temperature 0 can emit bytes that
# decode to no text for a long while, which would hide the first token from a client)
PROMPT = "hello"


def direct_run(engine, spec: JobSpec) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    first = None
    for chunk in generate(engine, spec):
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
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": tokens,
            "stream": True,
            "ignore_eos": True,
            "temperature": 1.0,
            "seed": SEED,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def measure(
    engine,
    spec: JobSpec,
    port: int,
    request: bytes,
    store: Store,  # type: ignore[no-untyped-def]
    args: argparse.Namespace,
) -> dict[str, list[float]]:
    """`--runs` alternating pairs (after a warm-up pair), each after the same idle pause: direct, then onelane."""
    runs: dict[str, list[float]] = {"d_first": [], "d_total": [], "o_first": [], "o_total": [], "o_gen": []}
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        for n in range(args.runs + 1):
            time.sleep(args.pause)
            direct = direct_run(engine, spec)
            time.sleep(args.pause)
            onelane = onelane_run(sock, request, store)
            if n == 0:
                continue  # warm-up
            for key, value in zip(runs, (*direct, *onelane)):
                runs[key].append(value)
    finally:
        sock.close()
    return runs


def report(args: argparse.Namespace, runs: dict[str, list[float]]) -> None:
    med = statistics.median
    ms = 1000
    d_first, d_total, o_first, o_total, o_gen = runs.values()

    def paired(a: list[float], b: list[float]) -> float:
        return med([x - y for x, y in zip(a, b)])

    print(
        f"tiny demo model, {args.tokens} tokens, chat prompt, {args.runs} alternating runs after {args.pause:g} s idle "
        f"each, load average {os.getloadavg()[0]:.2f}; medians (paired difference)"
    )
    print(
        f"time to first token: direct {med(d_first) * ms:.2f} ms, through onelane (SSE) {med(o_first) * ms:.2f} ms "
        f"-> {paired(o_first, d_first) * ms:+.2f} ms"
    )
    extra = paired(o_total, d_total)
    print(
        f"whole job:           direct {med(d_total) * ms:.1f} ms, through onelane end to end {med(o_total) * ms:.1f} ms "
        f"-> {extra * ms:+.1f} ms ({extra / med(d_total) * 100:+.1f} %)"
    )
    print(
        f"generation alone (started -> finished in Redis): {med(o_gen) * ms:.1f} ms -> "
        f"{paired(o_gen, d_total) * ms:+.1f} ms vs direct"
    )
    print("targets: extra time <= 2 % and <= 5 ms; first token <= direct + 5 ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--pause", type=float, default=0.1, help="idle seconds before every run, both ways")
    args = parser.parse_args()
    preload_openblas()  # measure direct generation as workers run it
    from worker.batch.engine import Engine

    with bench_env("tiny", max_queue=1000, max_queued_per_user=1000) as settings:
        params = SamplingParams(max_tokens=args.tokens, ignore_eos=True, temperature=1.0, seed=SEED)
        spec = JobSpec(owner="b", model="m", messages=(Message(role="user", content=PROMPT),), params=params)
        engine = Engine.load(settings.model_path)
        store = Store.connect(settings)
        port = free_port()
        with (
            onelane_worker(settings, settings.var_dir / "worker.log", supervised=False, quiet=True),
            onelane_web(settings, port, settings.var_dir / "web.log", 1, quiet=True),
        ):
            if not poll_until(lambda: store.readings.snapshot().workers, 60, every_s=0.05):
                raise RuntimeError("the worker never took the device")
            runs = measure(engine, spec, port, chat_request(port, settings.model_name, args.tokens), store, args)
    report(args, runs)


if __name__ == "__main__":
    main()
