"""Embeddings from many clients: onelane against one request at a time, and against mlx-vlm's server (issue 49).

    ./dev.sh bench embeddings [--inputs 1000] [--clients 16] [--per-request 1] [--rounds 3]

No real embedding checkpoint can be downloaded here, so the model is a random-weight Qwen3-Embedding of tests/
tiny_kinds.py of 4.5 M parameters (hidden 256, 4 layers, float32, last-token pooling, the demo tokenizer), written once
into a temporary folder that every server loads. Each round sends the same `--inputs` sentences (8 to 64 words),
`--per-request` to a request:

- onelane, `--clients` clients at once: each sends its next request as soon as the last one answered;
- onelane, one client: one request at a time (what a server that reads each request alone would do with them all);
- mlx-vlm's server (`python -m mlx_vlm.server --embedding-model FOLDER`), `--clients` clients at once.

The servers take turns within a round, their order rotated each round. Printed per server: inputs/s (median and
range over rounds), request latency p50/p99 of the last round, failures; and the ratios of the medians. Every figure
is measured in this run; every process started is stopped before the script returns.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import requests

from bench.harness import bench_env, free_port, onelane_stack, poll_until, rotated, spawn, tail

SHAPE = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             intermediate_size=1024)  # fmt: skip
WORDS = "the queue keeps the gpu busy and users informed a job waits starts streams tokens then ends".split()


def sentences(n: int) -> list[str]:
    """`n` sentences of 8 to 64 words (a fixed spread, the same every run)."""
    return [" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(8 + (i * 37) % 57)) for i in range(n)]


def drive(url: str, model: str, inputs: list[str], clients: int, per: int) -> tuple[float, list[float], int]:
    """Send every input, `per` to a request, from `clients` clients at once: (seconds, latencies, failures)."""
    chunks = [inputs[i : i + per] for i in range(0, len(inputs), per)]
    lock, latencies, failures = threading.Lock(), [], [0]
    it = iter(chunks)

    def client() -> None:
        with requests.Session() as session:
            while True:
                with lock:
                    chunk = next(it, None)
                if chunk is None:
                    return
                began = time.perf_counter()
                try:
                    reply = session.post(f"{url}/v1/embeddings", json={"model": model, "input": chunk}, timeout=600)
                    ok = reply.status_code == 200 and len(reply.json()["data"]) == len(chunk)
                except requests.RequestException:
                    ok = False
                with lock:
                    latencies.append(time.perf_counter() - began)
                    failures[0] += not ok

    threads = [threading.Thread(target=client) for _ in range(clients)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - began, latencies, failures[0]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--per-request", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from tests.tiny_kinds import build_embedding

    inputs = sentences(args.inputs)
    with tempfile.TemporaryDirectory(prefix="onelane-bench-embed-") as tmp:
        folder = build_embedding(Path(tmp) / "embedder", **SHAPE)
        models = Path(tmp) / "models.toml"
        models.write_text(f'[models.embedder]\npath = "{folder}"\n')
        with bench_env() as settings:  # (its model is not served: the models file names the one served)
            port = free_port()
            vlm_log = Path(tmp) / "mlx_vlm.log"
            vlm_args = [sys.executable, "-m", "mlx_vlm.server", "--port", str(port), "--embedding-model", str(folder)]
            with (
                onelane_stack(settings, quiet=True, ONELANE_MODEL="", ONELANE_MODELS_FILE=str(models)) as stack,
                spawn(vlm_args, vlm_log) as vlm,
            ):
                vlm_url = f"http://127.0.0.1:{port}"
                if not poll_until(lambda: _answers(vlm_url, str(folder)), 180):
                    raise RuntimeError(f"mlx-vlm's server did not answer:\n{tail(vlm_log)}")
                warm = [(stack.url, "embedder"), (vlm_url, str(folder))]
                for url, name in warm:  # each loads its model before the clock starts
                    drive(url, name, inputs[:32], 4, args.per_request)
                runs: dict[str, Callable[[], tuple[float, list[float], int]]] = {
                    f"onelane, {args.clients} clients": lambda: drive(
                        stack.url, "embedder", inputs, args.clients, args.per_request
                    ),
                    "onelane, 1 client (one request at a time)": lambda: drive(
                        stack.url, "embedder", inputs, 1, args.per_request
                    ),
                    f"mlx-vlm server, {args.clients} clients": lambda: drive(
                        vlm_url, str(folder), inputs, args.clients, args.per_request
                    ),
                }
                results: dict[str, list[tuple[float, list[float], int]]] = {name: [] for name in runs}
                for r in range(args.rounds):
                    for name in rotated(list(runs), r):
                        print(f"round {r + 1}: {name} (load average {os.getloadavg()[0]:.2f})", flush=True)
                        results[name].append(runs[name]())
                alive = vlm.poll() is None
    print(f"\n{args.inputs} inputs, {args.per_request} a request; model: Qwen3-Embedding shape {SHAPE}, float32")
    rates = {}
    for name, rounds in results.items():
        per_s = [args.inputs / seconds for seconds, _, _ in rounds]
        rates[name] = statistics.median(per_s)
        _, latencies, _ = rounds[-1]
        failed = sum(f for _, _, f in rounds)
        print(
            f"  {name:45s} {rates[name]:8.1f} inputs/s (range {min(per_s):.1f}-{max(per_s):.1f}); latency p50 "
            f"{percentile(latencies, 50) * 1e3:.0f} ms, p99 {percentile(latencies, 99) * 1e3:.0f} ms; failed {failed}"
        )
    names = list(rates)
    print(f"  onelane {args.clients} clients / onelane one at a time: {rates[names[0]] / rates[names[1]]:.2f}x")
    print(f"  onelane {args.clients} clients / mlx-vlm server:        {rates[names[0]] / rates[names[2]]:.2f}x")
    if not alive:
        print("  ! mlx-vlm's server had exited by the end (see its log)")


def _answers(url: str, model: str) -> bool:
    try:
        return requests.post(f"{url}/v1/embeddings", json={"model": model, "input": "hi"}, timeout=120).ok
    except requests.RequestException:
        return False


if __name__ == "__main__":
    main()
