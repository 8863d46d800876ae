"""Preemption (issue 51): interactive questions arriving while long batch-class jobs fill the batch, with preemption
off (ONELANE_PREEMPT_LIMIT=0) and on (ONELANE_PREEMPT_LIMIT=2, the default), same run.

    ./dev.sh bench preemption [--model smollm2|demo|PATH] [--rounds 1] [--batch 8] [--batch-jobs 32]
                              [--batch-tokens 256] [--interactive 20] [--interval 1] [--interactive-tokens 32]
                              [--preempt-limit 2] [--timeout 1800]

Each order gets a fresh stack (Redis, `onelane worker`, `onelane web`) with ONELANE_MAX_BATCH=--batch and a keys
file of two users of weight 1, `batch` and `interactive`; "off" runs it with ONELANE_PREEMPT_LIMIT=0, "on" with
ONELANE_PREEMPT_LIMIT=--preempt-limit (a batch-class job may be set aside that many times for interactive work).
After one warm-up question, user `batch` sends --batch-jobs chat completions at once (POST /v1/chat/completions, not
streamed, `service_tier: "flex"`, which is onelane's batch class; --batch-tokens each, ignore_eos, so the lengths
hold); once --batch of them run and the rest wait (read from Redis), user `interactive` sends --interactive streamed
questions (`stream: true`, --interactive-tokens each, ignore_eos), one every --interval seconds. All greedy.

Printed per order: how long the batch took to fill; the interactive questions' TTFT (sent to their first content
chunk) p50, p99 and max (p99 is the nearest rank, bench/report.py's pct: with 20 questions, the slowest one) and
their answer time (sent to [DONE]) p50; the batch jobs' total time (the first one sent to the last one's answer) and their mean
completion time (sent to answered), how many of them the job records show in the batch class; failures by kind.
Then, over --rounds rounds (the order alternating round by round), each figure's median (min-max) per order and the
per-round ratio on / off. Every figure is measured in this run; every process started is stopped before it returns.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.chat_servers import QUESTIONS
from bench.harness import (
    add_model_option,
    bench_env,
    model_folder,
    onelane_stack,
    poll_until,
    prompt,
    queue_bounds,
    rotated,
)
from bench.openai_load import Outcome, Streamed, post_chat, stream_once
from bench.report import pct, span
from tasks import keys
from tasks.settings import ENV_NAMES
from tasks.store import Store

SETTING = "ONELANE_PREEMPT_LIMIT"
USERS = ("batch", "interactive")
FILL_S = 180.0  # longest wait for the batch to fill before the interactive questions are sent


@dataclass
class Order:
    """One order's run: the batch jobs' outcomes, the interactive questions' streams, and what the stack showed."""

    name: str
    limit: int
    batch: list[Outcome] = field(default_factory=list)
    interactive: list[Streamed] = field(default_factory=list)
    fill_s: float | None = None  # from the first batch job sent until the batch was full and the rest waited
    batch_class: int = 0  # batch jobs whose record holds the batch class
    preempted: list[int] = field(default_factory=list)  # each batch job's preemptions, by its record
    alive: bool = True

    def ttft(self, q: float) -> float | None:
        ttfts = [s.ttft for s in self.interactive if s.error is None and s.ttft is not None]
        return pct(ttfts, q) if ttfts else None

    def answer(self, q: float) -> float | None:
        totals = [s.total for s in self.interactive if s.error is None]
        return pct(totals, q) if totals else None

    def batch_total(self) -> float | None:
        """From the first batch job sent to the last one's answer (or failure)."""
        if not self.batch:
            return None
        return max(o.ended for o in self.batch) - min(o.ended - o.latency for o in self.batch)

    def batch_mean(self) -> float | None:
        ok = [o.latency for o in self.batch if o.ok]
        return statistics.fmean(ok) if ok else None

    def failures(self) -> Counter[str]:
        failed: Counter[str] = Counter(f"batch {o.error}" for o in self.batch if not o.ok)
        failed.update(f"interactive {s.error}" for s in self.interactive if s.error is not None)
        return failed


def run(model: str, args: argparse.Namespace, name: str, limit: int) -> Order:
    """One order on a fresh stack: the batch jobs, then (once the batch is full) the interactive questions."""
    user_keys = {u: f"bench-{u}-key-0123456789" for u in USERS}
    extra = {
        **queue_bounds(1000),
        "ONELANE_MAX_BATCH": str(args.batch),
        "ONELANE_MAX_TOKENS_LIMIT": str(max(4096, args.batch_tokens, args.interactive_tokens)),
        SETTING: str(limit),
    }
    order = Order(name, limit)
    with bench_env(model=model) as settings:
        users_file = Path(settings.var_dir) / "keys.toml"
        users_file.write_text("".join(f'[users.{u}]\nkey = "{user_keys[u]}"\nweight = 1\n' for u in USERS))
        extra["ONELANE_API_KEYS_FILE"] = str(users_file)
        with onelane_stack(settings, quiet=True, **extra) as stack:
            store = Store.connect(settings)
            try:
                auth = {u: {"Authorization": f"Bearer {user_keys[u]}"} for u in USERS}
                common = {"model": settings.model_name, "temperature": 0, "ignore_eos": True}
                warm = post_chat(
                    stack.url, {**common, "messages": _user("Hello!"), "max_tokens": 4}, 120, auth["interactive"]
                )
                if not warm.ok:
                    raise RuntimeError(f"the warm-up question failed: {warm.error}")
                batch_bodies = [
                    {
                        **common,
                        "messages": _user(f"Job {n + 1}: write a long essay about {prompt(n)}."),
                        "max_tokens": args.batch_tokens,
                        "service_tier": "flex",
                    }
                    for n in range(args.batch_jobs)
                ]
                asks = [
                    {
                        **common,
                        "messages": _user(f"Question {n + 1}: {QUESTIONS[n % len(QUESTIONS)]}"),
                        "max_tokens": args.interactive_tokens,
                        "stream": True,
                    }
                    for n in range(args.interactive)
                ]
                order.batch = [Outcome(False, 0.0, "not sent")] * args.batch_jobs
                order.interactive = [Streamed(None, 0.0, 0, False, "not sent")] * args.interactive

                def send_batch(n: int) -> None:
                    order.batch[n] = post_chat(stack.url, batch_bodies[n], args.timeout, auth["batch"])

                def ask(n: int) -> None:
                    order.interactive[n] = stream_once(stack.url, asks[n], args.timeout, auth["interactive"])

                started = time.monotonic()
                batch_threads = _start(send_batch, args.batch_jobs, "batch")
                order.fill_s = _filled(store, args, started)
                ask_threads: list[threading.Thread] = []
                first = time.monotonic()
                for n in range(args.interactive):
                    time.sleep(max(0.0, first + n * args.interval - time.monotonic()))
                    ask_threads += _start(ask, 1, "interactive", offset=n)
                for thread in batch_threads + ask_threads:  # (each request is bounded by --timeout)
                    thread.join(args.timeout + 60)
                order.batch_class = _batch_class(store, [o.job_id for o in order.batch if o.job_id])
                order.preempted = _preemptions(store, [o.job_id for o in order.batch if o.job_id])
                order.alive = stack.alive
            finally:
                store.redis.close()
    return order


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _start(target: Callable[[int], None], n: int, name: str, offset: int = 0) -> list[threading.Thread]:
    threads = [threading.Thread(target=target, args=(offset + k,), name=f"{name}-{offset + k}") for k in range(n)]
    for thread in threads:
        thread.start()
    return threads


def _filled(store: Store, args: argparse.Namespace, started: float) -> float | None:
    """Seconds from the first batch job sent until --batch of them ran and every other one waited (None: not within
    FILL_S; the questions are sent regardless)."""
    redis = store.redis
    running = min(args.batch, args.batch_jobs)

    def full() -> bool:
        pipe = redis.pipeline(transaction=False)
        pipe.zcard(keys.IN_PROGRESS)
        pipe.zcard(keys.QUEUE)
        in_progress, waiting = pipe.execute()
        return in_progress >= running and in_progress + waiting >= args.batch_jobs

    if poll_until(full, FILL_S, every_s=0.05):
        return time.monotonic() - started
    print(f"  ! the batch did not fill within {FILL_S:.0f} s: the questions are sent regardless", flush=True)
    return None


def _batch_class(store: Store, ids: list[str]) -> int:
    """How many of these jobs' records hold the batch class."""
    redis = store.redis
    pipe = redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(keys.job(job_id), "class")
    return sum(1 for cls in pipe.execute() if cls == "batch")


def _preemptions(store: Store, ids: list[str]) -> list[int]:
    """How many times each of these jobs was set aside for interactive work, by its record."""
    pipe = store.redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(keys.job(job_id), "preemptions")
    return [int(n or 0) for n in pipe.execute()]


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def secs(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"


def order_lines(o: Order) -> list[str]:
    failed = o.failures()
    kinds = ", ".join(f"{k} {n}" for k, n in failed.most_common()) or "none"
    ok = [x for x in o.batch if x.ok]
    tokens = [x.completion_tokens for x in ok]
    fill = "did not fill" if o.fill_s is None else f"full {o.fill_s:.1f} s after the first batch job was sent"
    return [
        f"    batch {fill}; interactive: TTFT p50 {ms(o.ttft(50))} ms, p90 {ms(o.ttft(90))} ms, p99 {ms(o.ttft(99))} ms, max "
        f"{ms(o.ttft(100))} ms; answer p50 {ms(o.answer(50))} ms "
        f"({sum(1 for s in o.interactive if s.error is None)} of {len(o.interactive)} answered)",
        f"    batch jobs: total {secs(o.batch_total())} s (first sent to last answered), mean completion "
        f"{secs(o.batch_mean())} s, {len(ok)} of {len(o.batch)} answered, tokens each "
        f"{min(tokens, default=0)}-{max(tokens, default=0)}, {o.batch_class} in the batch class by their records; "
        f"failed {sum(failed.values())} ({kinds})" + ("" if o.alive else "; ! a process of the stack had exited"),
        f"    preemptions: {sum(o.preempted)} in all; batch jobs set aside 0 / 1 / 2+ times: "
        f"{sum(1 for n in o.preempted if n == 0)} / {sum(1 for n in o.preempted if n == 1)} / "
        f"{sum(1 for n in o.preempted if n >= 2)}",
    ]


FIGURES: list[tuple[str, Callable[[Order], float | None], float, str]] = [  # label, figure, scale, format
    ("interactive TTFT p50 (ms)", lambda o: o.ttft(50), 1e3, "{:.0f}"),
    ("interactive TTFT p90 (ms)", lambda o: o.ttft(90), 1e3, "{:.0f}"),
    ("interactive TTFT p99 (ms)", lambda o: o.ttft(99), 1e3, "{:.0f}"),
    ("interactive TTFT max (ms)", lambda o: o.ttft(100), 1e3, "{:.0f}"),
    ("interactive answer p50 (ms)", lambda o: o.answer(50), 1e3, "{:.0f}"),
    ("batch jobs' total time (s)", Order.batch_total, 1.0, "{:.1f}"),
    ("batch jobs' mean completion (s)", Order.batch_mean, 1.0, "{:.1f}"),
]


def summary_lines(off: list[Order], on: list[Order]) -> list[str]:
    """Per figure: each order's median (min-max) over the rounds, and the per-round ratios on / off."""
    head_on = f"on (limit {on[0].limit})" if on else "on"
    lines = [f"  {'':34s} {'off (limit 0)':>20s} {head_on:>20s} {'on / off':>18s}"]
    for label, figure, scale, fmt in FIGURES:
        a = [v * scale for o in off if (v := figure(o)) is not None]
        b = [v * scale for o in on if (v := figure(o)) is not None]
        ratios = [y / x for p, q in zip(off, on) if (x := figure(p)) and (y := figure(q)) is not None]
        lines.append(f"  {label:34s} {span(a, fmt):>20s} {span(b, fmt):>20s} {span(ratios, '{:.2f}x'):>18s}")
    for name, orders in (("off", off), ("on", on)):
        failed = sum((o.failures() for o in orders), Counter())
        sent = sum(len(o.batch) + len(o.interactive) for o in orders)
        kinds = ", ".join(f"{k} {n}" for k, n in failed.most_common()) or "none"
        lines.append(f"  {name}: failed {sum(failed.values())} of {sent} requests ({kinds})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_option(parser)
    parser.add_argument("--rounds", type=int, default=1, help="rounds, the order alternating round by round")
    parser.add_argument("--batch", type=int, default=8, help="ONELANE_MAX_BATCH")
    parser.add_argument("--batch-jobs", type=int, default=32, help="batch-class jobs sent at once")
    parser.add_argument("--batch-tokens", type=int, default=256, help="each batch job's max_tokens (ignore_eos)")
    parser.add_argument("--interactive", type=int, default=20, help="interactive questions")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between two interactive questions")
    parser.add_argument("--interactive-tokens", type=int, default=32, help="each question's max_tokens (ignore_eos)")
    parser.add_argument("--preempt-limit", type=int, default=2, help=f"{SETTING} of the 'on' order")
    parser.add_argument("--timeout", type=float, default=1800.0, help="a request's longest wait, in seconds")
    args = parser.parse_args()
    counts = (args.rounds, args.batch, args.batch_jobs, args.batch_tokens, args.interactive, args.interactive_tokens)
    if min(counts) < 1 or args.preempt_limit < 1 or args.interval < 0 or args.timeout <= 0:
        parser.error("every count must be at least 1, --preempt-limit too; --interval at least 0")
    known = SETTING in ENV_NAMES.values()
    with tempfile.TemporaryDirectory(prefix="onelane-bench-model-") as tmp:
        model = str(model_folder(args.model, Path(tmp)))
        print(
            f"model {args.model}; ONELANE_MAX_BATCH {args.batch}; {args.batch_jobs} batch jobs x {args.batch_tokens} "
            f"tokens, then {args.interactive} interactive questions x {args.interactive_tokens} tokens, one every "
            f"{args.interval:g} s; {args.rounds} round(s); load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        if not known:
            print(
                f"  ! {SETTING} is not a setting of this checkout (tasks/settings.py): the worker ignores it, so both "
                "orders run alike",
                flush=True,
            )
        results: dict[int, list[Order]] = {0: [], args.preempt_limit: []}
        for r in range(args.rounds):
            for limit in rotated([0, args.preempt_limit], r):
                name = "off" if limit == 0 else "on"
                print(
                    f"round {r + 1}: preemption {name} ({SETTING}={limit}; load average {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
                results[limit].append(run(model, args, name, limit))
                print("\n".join(order_lines(results[limit][-1])), flush=True)
    print(f"\n{args.rounds} round(s); medians (min-max) over the rounds; ratios round by round:")
    print("\n".join(summary_lines(results[0], results[args.preempt_limit])))


if __name__ == "__main__":
    main()
