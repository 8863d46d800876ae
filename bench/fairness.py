"""Fair in what the device spends (issue 51): two users, one of long prompts and long answers, one of short questions,
both closed-loop, on one onelane; the fair order counting jobs against the fair order charging tokens, same run.

    ./dev.sh bench fairness [--model smollm2|demo|PATH] [--seconds 180] [--clients 16] [--batch 4]
                            [--long-prompt 2000] [--long-answer 512] [--short-answer 64] [--weights 1,1]

Each order gets a fresh stack (Redis, worker, web) with ONELANE_MAX_BATCH=--batch, so that jobs queue and the order
decides who runs. User `long` keeps --clients requests in flight, each a prompt of about --long-prompt tokens and an
answer of --long-answer tokens; user `short` as many, each a question of about 50 tokens and an answer of
--short-answer tokens (EOS ignored, so the lengths hold). After --seconds, the clients stop sending and the figures
are read from the jobs that ended within the window:
- each user's tokens (prompt read, generated) and device-seconds: prompt tokens at the worker's measured seconds per
  prompt token plus generated tokens at its seconds per sequence and its step's share (worker/pace.py, read from
  Redis), so that both orders are measured by the same clock;
- Jain's index of each user's service over weight: (sum x)^2 / (n * sum x^2), x = device-seconds / weight; 1 is
  perfectly fair, 0.5 is one user taking everything.
"Counting jobs" is the token order with both token weights at 0.001: every job then costs its flow the least unit,
as onelane's order did before it charged tokens. Every figure is measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.chat_servers import system_message
from bench.harness import add_model_option, bench_env, model_folder, onelane_stack, queue_bounds
from bench.openai_load import post_chat
from tasks import keys

USERS = ("long", "short")


@dataclass
class Served:
    prompt: int = 0
    generated: int = 0
    jobs: int = 0
    errors: list[str] = field(default_factory=list)


def client(url: str, key: str, body: dict, until: float, served: Served, lock: threading.Lock) -> None:
    while time.monotonic() < until:
        got = post_chat(url, body, 900, {"Authorization": f"Bearer {key}"})
        with lock:
            if got.ok and got.ended is not None and got.ended <= until:
                served.prompt += got.prompt_tokens - got.cached_tokens
                served.generated += got.completion_tokens
                served.jobs += 1
            elif not got.ok:
                served.errors.append(got.error or "?")
                time.sleep(1)  # (an error: do not spin)


def run(model: str, args: argparse.Namespace, weights: tuple[float, float], token_order: bool) -> dict:
    keys_ = {u: f"bench-{u}-key-0123456789" for u in USERS}
    extra = {
        **queue_bounds(1000),
        "ONELANE_API_KEYS_FILE": "",
        "ONELANE_MAX_BATCH": str(args.batch),
        "ONELANE_MAX_TOKENS_LIMIT": "4096",
        "ONELANE_MAX_PROMPT_CHARS": "400000",
        "ONELANE_PREFIX_CACHE": "0",  # (every prompt read whole: the long user's would hit, which is its own lead)
    }
    if not token_order:
        extra |= {"ONELANE_FAIR_PROMPT_WEIGHT": "0.001", "ONELANE_FAIR_OUTPUT_WEIGHT": "0.001"}
    with bench_env(model=model) as settings:
        users_file = Path(settings.var_dir) / "keys.toml"
        users_file.write_text(
            "".join(f'[users.{u}]\nkey = "{keys_[u]}"\nweight = {w}\n' for u, w in zip(USERS, weights))
        )
        extra["ONELANE_API_KEYS_FILE"] = str(users_file)
        with onelane_stack(settings, quiet=True, **extra) as stack:
            from tasks.store import Store

            store = Store.connect(settings)
            long_prompt = system_message(int(args.long_prompt * 4.6))
            bodies = {
                "long": {
                    "model": settings.model_name,
                    "messages": [{"role": "user", "content": long_prompt + "\nSum it up."}],
                    "max_tokens": args.long_answer,
                    "ignore_eos": True,
                    "temperature": 0,
                },
                "short": {
                    "model": settings.model_name,
                    "messages": [{"role": "user", "content": "What is a queue, and why would a GPU need one? " * 4}],
                    "max_tokens": args.short_answer,
                    "ignore_eos": True,
                    "temperature": 0,
                },
            }
            served = {u: Served() for u in USERS}
            lock = threading.Lock()
            until = time.monotonic() + args.seconds
            threads = [
                threading.Thread(target=client, args=(stack.url, keys_[u], bodies[u], until, served[u], lock))
                for u in USERS
                for _ in range(args.clients)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            pace = json.loads(store.redis.hget(keys.model(settings.model_name), "pace") or "[0, 0, 0]")
            service = dict(store.redis.zrange(keys.SERVICE, 0, -1, withscores=True))
            store.redis.close()
    step_s, per_sequence_s, per_prompt_token_s = pace
    per_token_s = per_sequence_s + step_s / args.batch  # a generated token's share of a full batch's step
    seconds = {u: served[u].prompt * per_prompt_token_s + served[u].generated * per_token_s for u in USERS}
    x = [seconds[u] / w for u, w in zip(USERS, weights)]
    jain = sum(x) ** 2 / (len(x) * sum(v * v for v in x)) if any(x) else 0.0
    return {"served": served, "seconds": seconds, "jain": jain, "pace": pace, "service": service}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_option(parser)
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--long-prompt", type=int, default=2000)
    parser.add_argument("--long-answer", type=int, default=512)
    parser.add_argument("--short-answer", type=int, default=64)
    parser.add_argument("--weights", default="1,1", help="the long user's and the short user's weights")
    args = parser.parse_args()
    weights = tuple(float(w) for w in args.weights.split(","))
    assert len(weights) == 2
    with tempfile.TemporaryDirectory(prefix="onelane-bench-model-") as tmp:
        model = str(model_folder(args.model, Path(tmp)))
        print(
            f"model {args.model}; {args.clients} clients a user, batch {args.batch}, {args.seconds:.0f} s an order; "
            f"weights long:short {weights[0]:g}:{weights[1]:g}; load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        for name, token_order in (("counting jobs", False), ("charging tokens", True)):
            got = run(model, args, weights, token_order)  # type: ignore[arg-type]
            print(
                f"\n{name} (pace: step {got['pace'][0] * 1000:.1f} ms, {got['pace'][1] * 1000:.1f} ms a sequence, "
                f"{got['pace'][2] * 1000:.2f} ms a prompt token):"
            )
            for u in USERS:
                s = got["served"][u]
                share = got["seconds"][u] / max(sum(got["seconds"].values()), 1e-9)
                print(
                    f"  {u:<6} {s.jobs:>4} jobs, {s.prompt:>7} prompt tokens read, {s.generated:>6} generated, "
                    f"{got['seconds'][u]:7.1f} device-s ({share:.0%})"
                    + (f", errors {s.errors[:3]}" if s.errors else "")
                )
            print(f"  Jain's index of device-seconds over weight: {got['jain']:.3f}", flush=True)


if __name__ == "__main__":
    main()
