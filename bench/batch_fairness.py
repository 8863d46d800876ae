"""A batch beside interactive users: one user's Batch API batch of many lines, and 4 interactive users at once.
How long the interactive jobs wait in the queue with and without the batch running, and how long the batch takes
with and without them.

    ./dev.sh bench batch_fairness [--model smollm2|demo|PATH] [--lines 1000] [--line-tokens 16] [--users 4]
                                  [--chat-tokens 32] [--requests 15] [--rounds 1]

One stack (`onelane worker` + `onelane web`, a private Redis; prefix cache off, so that no phase reads another's
prompts from it; each user an API key of their own), three phases a round:
1. interactive alone: each of the users sends --requests chat completions back to back (closed loop);
2. batch + interactive: the batch user uploads a JSONL file of --lines chat requests and creates a batch; at once
   the users send back to back until the batch ends;
3. batch alone: the same batch again, nobody else.
An interactive job's queue wait is the server's x-queue-time (admitted to started, read from the job's own record).
The batch's time is from its creation to its end (polled every 0.2 s). `smollm2` is the default model,
SmolLM2-135M-Instruct, imported from its GGUF as float32 (what the worker does on a CPU); `demo` is worker/demo.

Every figure printed is measured in this run; every process started here is stopped before the script returns.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from dataclasses import dataclass, field

import requests

from bench.harness import add_model_option, at_once, bench_env, onelane_stack
from bench.report import pct, spread

BATCH_USER = "batcher"
QUESTIONS = [
    "What is a queue?",
    "Name three colours.",
    "Why is the sky blue?",
    "What is 12 times 12?",
    "Say hello in French.",
    "What is a GPU for?",
    "Give me a word that rhymes with cat.",
]


@dataclass
class Phase:
    name: str
    waits: list[float] = field(default_factory=list)  # interactive queue waits, s
    served: int = 0  # interactive requests answered
    errors: list[str] = field(default_factory=list)
    batch_s: float | None = None  # the batch's creation to its end
    batch_counts: tuple[int, int] | None = None  # (completed, failed)


def keys_env(users: int) -> dict[str, str]:
    names = [BATCH_USER] + [f"user{n}" for n in range(users)]
    return {"ONELANE_API_KEYS": ",".join(f"{name}:key-{name}" for name in names)}


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer key-{name}"}


def chat(url: str, model: str, user: str, n: int, tokens: int, phase: Phase) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"{QUESTIONS[n % len(QUESTIONS)]} ({user} {n})"}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    reply = requests.post(f"{url}/v1/chat/completions", json=body, headers=auth(user), timeout=600)
    if reply.status_code != 200:
        phase.errors.append(f"{reply.status_code} {reply.text[:120]}")
        return
    phase.waits.append(float(reply.headers["x-queue-time"]))
    phase.served += 1


def users_until(
    url: str, model: str, users: int, tokens: int, phase: Phase, done: threading.Event | None, requests_each: int
) -> None:
    """`users` closed-loop users, each sending `requests_each` requests, or (with `done`) until it is set."""

    def loop(u: int) -> None:
        n = 0
        while (done is None and n < requests_each) or (done is not None and not done.is_set()):
            chat(url, model, f"user{u}", n, tokens, phase)
            n += 1

    at_once(users, loop, name="user")


def run_batch(url: str, model: str, lines: int, tokens: int, tag: str, phase: Phase, done: threading.Event) -> None:
    data = "".join(
        json.dumps(
            {
                "custom_id": f"{tag}-{n}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": model,
                    "max_tokens": tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                    "messages": [{"role": "user", "content": f"Line {n} of {tag}: {QUESTIONS[n % len(QUESTIONS)]}"}],
                },
            }
        )
        + "\n"
        for n in range(lines)
    ).encode()
    try:
        sent = requests.post(
            f"{url}/v1/files",
            headers=auth(BATCH_USER),
            data={"purpose": "batch"},
            files={"file": ("batch.jsonl", data)},
            timeout=60,
        ).json()
        started = time.monotonic()
        batch = requests.post(
            f"{url}/v1/batches",
            headers=auth(BATCH_USER),
            timeout=120,
            json={"input_file_id": sent["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        ).json()
        while batch["status"] not in ("completed", "failed", "expired", "cancelled"):
            time.sleep(0.2)  # (a client polls a batch; the bench does as OpenAI's SDK examples do)
            batch = requests.get(f"{url}/v1/batches/{batch['id']}", headers=auth(BATCH_USER), timeout=30).json()
        phase.batch_s = time.monotonic() - started
        counts = batch["request_counts"]
        phase.batch_counts = (counts["completed"], counts["failed"])
    finally:
        done.set()


def summary(phase: Phase) -> str:
    w = phase.waits
    waits = (
        (
            f"queue wait p50 {pct(w, 50) * 1000:.0f} ms, p99 {pct(w, 99) * 1000:.0f} ms, mean "
            f"{statistics.fmean(w) * 1000:.0f} ms ({phase.served} requests)"
        )
        if w
        else "no interactive request"
    )
    batch = f"; batch {phase.batch_s:.1f} s, {phase.batch_counts}" if phase.batch_s is not None else ""
    errors = f"; errors {len(phase.errors)}: {phase.errors[:2]}" if phase.errors else ""
    return waits + batch + errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_option(parser)
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--line-tokens", type=int, default=16)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--chat-tokens", type=int, default=32)
    parser.add_argument("--requests", type=int, default=15, help="each user's requests in the interactive-alone phase")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    with bench_env(model=args.model) as settings:
        model, folder, name = settings.model_path, settings.var_dir, settings.model_name
        env = {**keys_env(args.users), "ONELANE_PREFIX_CACHE": "0"}
        print(
            f"model {model}; a batch of {args.lines} lines x {args.line_tokens} tokens; {args.users} users x "
            f"{args.chat_tokens}-token chats; ONELANE_BATCH_COST 10, ONELANE_BATCH_WAITING 8, ONELANE_MAX_BATCH 32; "
            f"logs in {folder}",
            flush=True,
        )
        phases: dict[str, list[Phase]] = {"interactive alone": [], "batch + interactive": [], "batch alone": []}
        with onelane_stack(settings, quiet=True, **env) as stack:
            url = stack.url
            chat(url, name, "user0", 0, 4, Phase("warm-up"))
            for rnd in range(args.rounds):
                alone = Phase("interactive alone")
                users_until(url, name, args.users, args.chat_tokens, alone, None, args.requests)
                mixed = Phase("batch + interactive")
                done = threading.Event()
                batch = threading.Thread(
                    target=run_batch, args=(url, name, args.lines, args.line_tokens, f"r{rnd}-mixed", mixed, done)
                )
                batch.start()
                users_until(url, name, args.users, args.chat_tokens, mixed, done, 0)
                batch.join()
                solo = Phase("batch alone")
                run_batch(url, name, args.lines, args.line_tokens, f"r{rnd}-solo", solo, threading.Event())
                for phase in (alone, mixed, solo):
                    phases[phase.name].append(phase)
                    print(f"  round {rnd + 1}, {phase.name}: {summary(phase)}", flush=True)
        report(phases)


def report(phases: dict[str, list[Phase]]) -> None:
    alone, mixed, solo = phases["interactive alone"], phases["batch + interactive"], phases["batch alone"]
    wait_alone = [w for p in alone for w in p.waits]
    wait_mixed = [w for p in mixed for w in p.waits]
    print("\ninteractive queue wait (ms)        p50        p99       mean   requests")
    for label, waits in (("without the batch", wait_alone), ("with the batch running", wait_mixed)):
        print(
            f"  {label:<30} {pct(waits, 50) * 1000:>8.0f} {pct(waits, 99) * 1000:>10.0f} "
            f"{statistics.fmean(waits) * 1000:>10.0f} {len(waits):>10}"
        )
    with_users = [p.batch_s for p in mixed if p.batch_s]
    without = [p.batch_s for p in solo if p.batch_s]
    ratio = statistics.median(with_users) / statistics.median(without)
    print(
        f"\nbatch completion (s): with the interactive users {spread(with_users, '{:.1f}')}; alone "
        f"{spread(without, '{:.1f}')}; ratio {ratio:.2f}x"
    )
    print(
        f"batch lines (completed, failed): with users {[p.batch_counts for p in mixed]}, alone "
        f"{[p.batch_counts for p in solo]}; interactive requests served during the batch: "
        f"{[p.served for p in mixed]}"
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
