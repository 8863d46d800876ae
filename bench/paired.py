"""One client, request by request: each prompt of the streaming workload sent to onelane and to mlx_lm.server in
turn, which one first alternating, so that a slow spell of this shared machine falls on both alike.

    ./dev.sh bench paired [--model smollm2|demo|PATH] [--requests 40]

A level of compare_servers runs one server for ~45 s, then the other: at one client a drift of the machine moves
its ratio by ±7 %. Here each pair is seconds apart. Printed: the request time ratio onelane / peer over all pairs
(sums) and its median pair, the streamed TTFT medians, and whether both made the same tokens (greedy: they should).
What this design does not charge: the work a server does after an answer (it runs while the other one serves), which
compare_servers' level does charge; read both.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench.harness import add_model_option, bench_env, free_port, onelane_web, onelane_worker, queue_bounds
from bench.mlx_server import mlx_server
from bench.onelane_overload import onelane_body
from bench.openai_load import PROMPTS, post_chat
from bench.report import ms
from bench.streaming_load import MAX_TOKENS, Sent, http_sender, prompts
from worker.blas import preload_openblas

ROUNDS_OF_PROMPTS = 3  # the prompts of compare_servers' first 3 rounds at one client, 21 each


def pairs(url: str, model: str, peer: str, n: int) -> list[tuple[Sent, Sent]]:
    """`n` prompts, each to onelane (at `url`) and to the peer in turn, which first alternating; every third streamed."""
    send = {"onelane": http_sender(url, MAX_TOKENS, {"model": model}), "peer": http_sender(peer, MAX_TOKENS, {})}
    asked = [p for r in range(ROUNDS_OF_PROMPTS) for p in prompts(1, r, 21)[0]][:n]
    out = []
    for i, prompt in enumerate(asked):
        order = ("onelane", "peer") if i % 2 == 0 else ("peer", "onelane")
        got = {side: send[side](prompt, i % 3 == 2) for side in order}
        out.append((got["onelane"], got["peer"]))
    return out


def report(model: str, got: list[tuple[Sent, Sent]]) -> None:
    ok = [(a, b) for a, b in got if a.ok and b.ok]
    total = sum(a.latency for a, _ in ok) / sum(b.latency for _, b in ok)
    median = statistics.median(a.latency / b.latency for a, b in ok)
    same = sum(a.completion_tokens == b.completion_tokens for a, b in ok)
    ttft = [(a.ttft, b.ttft) for a, b in ok if a.ttft is not None and b.ttft is not None]
    print(f"model {model}: {len(got)} prompts, each to onelane and mlx_lm.server in turn (max_tokens {MAX_TOKENS})")
    print(f"  ok pairs {len(ok)}; the same number of tokens in {same} of them")
    print(f"  request time onelane / peer: all pairs {total:.3f}x, median pair {median:.3f}x")
    if ttft:
        a, b = statistics.median(t for t, _ in ttft), statistics.median(t for _, t in ttft)
        print(f"  streamed TTFT p50 onelane / peer: {ms(a)} / {ms(b)} ms (n={len(ttft)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_option(parser)
    parser.add_argument("--requests", type=int, default=40, help="prompts, each sent to both (at most 63)")
    args = parser.parse_args()
    preload_openblas()
    with bench_env(model=args.model) as settings:
        folder, bounds = Path(settings.var_dir), queue_bounds(1000)
        with (
            mlx_server(settings.model_path, folder / "mlx-server.log") as peer,
            onelane_worker(settings, folder / "worker.log", **bounds),
        ):
            port = free_port()
            with onelane_web(settings, port, folder / "web.log", ready="/readyz", **bounds):
                url = f"http://127.0.0.1:{port}"
                for prompt in PROMPTS[:2]:  # warm-up, as the peer's
                    post_chat(url, onelane_body(settings.model_name, prompt, 8), 60)
                report(args.model, pairs(url, settings.model_name, peer.url, args.requests))


if __name__ == "__main__":
    main()
