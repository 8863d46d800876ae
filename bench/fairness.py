"""Fair in what the device spends (issue 51): two users, one of long prompts and long answers, one of short questions,
both closed-loop, on one onelane; the fair order counting jobs against the fair order charging tokens, same run.

    ./dev.sh bench fairness [--model smollm2|demo|PATH] [--seconds 180] [--clients 16] [--batch 4]
                            [--long-prompt 2000] [--long-answer 512] [--short-answer 64] [--weights 1,1]
                            [--rounds 1] [--only-tokens]

Each order gets a fresh stack (Redis, worker, web) with ONELANE_MAX_BATCH=--batch, so that jobs queue and the order
decides who runs. User `long` keeps --clients requests in flight, each a prompt of about --long-prompt tokens and an
answer of --long-answer tokens; user `short` as many, each a question of about 50 tokens and an answer of
--short-answer tokens (EOS ignored, so the lengths hold). The users and their weights (--weights, whole numbers
1-100, long's then short's) are a users file, ONELANE_API_KEYS_FILE: `[users.long]` and `[users.short]`, each with its
`key` and `weight` (tasks/users.py), each client sending its user's key.

The window ends at --seconds, and the end is bounded: the clients send nothing more, and every job of either user
still queued or running is cancelled through the API (DELETE /v1/jobs/ID with its owner's key: a queued job never
runs, a running one stops within a step), again every SWEEP_S until every client has its answer and nothing waits
or runs, DRAIN_S at most. Then the figures are read from the jobs' records in Redis, on Redis's clock, the deadline
being Redis's time when the window closed:
- a job that completed by the deadline counts whole: its prompt tokens read, its tokens generated;
- a job cut at the deadline (it had its first token by then and ended after it, cancelled or completing in the
  moment before its cancel) counts its prompt, and of its tokens generated the share of its decode time (first
  token to end) that was within the window, as if it decoded at an even pace: what it got of the device in the
  window, give or take a step. A job cut in its prefill (started, no token yet) counts nothing: how much of its
  prompt was read is not on record; their number is printed, with the most they can have had (the whole prompt at
  the measured pace, and no more than their time in the batch), and Jain's index as if they had had it. A job that
  started after the deadline counts nothing;
- from those, each user's device-seconds: prompt tokens at the worker's measured seconds per prompt token plus
  generated tokens at its seconds per sequence and its step's share (worker/pace.py, read from Redis), so that
  both orders are measured by the same clock;
- Jain's index of each user's service over weight: (sum x)^2 / (n * sum x^2), x = device-seconds / weight; 1 is
  perfectly fair, 0.5 is one user taking everything; and the ratio of the users' device-seconds over the ratio of
  their weights (1 is exactly the weights' share; within 10 % is printed as such).
"Counting jobs" is the token order with both token weights at 0.001: every job then costs its flow the least unit,
as onelane's order did before it charged tokens. With --rounds N, each round runs both orders, the first of them
alternating round by round, and the summary gives medians with min-max over the rounds. Every figure is measured
in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from bench.chat_servers import system_message
from bench.harness import add_model_option, bench_env, model_folder, onelane_stack, queue_bounds
from bench.openai_load import Outcome, post_chat
from tasks import keys
from tasks.job import Job, JobStatus
from tasks.store import Store

USERS = ("long", "short")
ORDERS = (("counting jobs", False), ("charging tokens", True))
DRAIN_S = 45.0  # the longest the end of a window may take: what waits or runs cancelled, every client answered
SWEEP_S = 0.25  # between two sweeps of what still waits or runs, after the deadline
RECANCEL_S = 3.0  # a job still running this long after its cancel is cancelled again
TOLERANCE = 0.10  # "within 10 %" of the weights' ratio


@dataclass
class Served:
    """A user's service within the window, read from its jobs' records (see the module's docstring)."""

    prompt: int = 0  # prompt tokens read (not from a prefix cache), the cut jobs' included
    generated: float = 0.0  # tokens generated, the cut jobs' share included
    jobs: int = 0  # completed by the deadline
    cut: int = 0  # had their first token by the deadline, ended after it
    cut_generated: float = 0.0  # of `generated`, the cut jobs' share
    cut_in_prefill: int = 0  # started by the deadline, no token by then: not counted
    in_prefill: list[tuple[int, float]] = field(default_factory=list)  # each such job's (prompt tokens, s in the batch)
    errors: Counter[str] = field(default_factory=Counter)  # failed in the window: the client's error, or the job's
    runs: list[tuple[float, float | None]] = field(default_factory=list)  # each run's start and first token, s before
    #                                                                       the deadline (None: none by then)


@dataclass
class End:
    """How the window ended: what was cancelled, how long it took, what the clients still had out at the bound."""

    cancelled: dict[str, str] = field(default_factory=dict)  # {id: owner} of the jobs cancelled
    cancel_errors: Counter[str] = field(default_factory=Counter)
    drain_s: float = 0.0
    clients_left: int = 0
    jobs_left: int = 0
    overshoot_s: float = 0.0  # the latest end of a cut job after the deadline


def client(
    url: str, key: str, body: dict, until: float, bound: float, got: list[Outcome], lock: threading.Lock
) -> None:
    """One closed-loop client: a request, then the next, none sent after `until`; none waits past `bound`."""
    while (now := time.monotonic()) < until:
        outcome = post_chat(url, body, max(1.0, bound - now), {"Authorization": f"Bearer {key}"})
        with lock:
            got.append(outcome)
        if not outcome.ok and time.monotonic() < until:
            time.sleep(1)  # (an error: do not spin)


def unended(store: Store) -> dict[str, str]:
    """Every job waiting or running now: {id: its owner}."""
    ids = list(dict.fromkeys([*store.redis.zrange(keys.QUEUE, 0, -1), *store.redis.zrange(keys.IN_PROGRESS, 0, -1)]))
    pipe = store.redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(keys.job(job_id), "owner", "status")
    return {
        job_id: owner
        for job_id, (owner, status) in zip(ids, pipe.execute())
        if owner and status in (JobStatus.QUEUED.value, JobStatus.IN_PROGRESS.value)
    }


def cancel(url: str, key: str, job_id: str) -> str | None:
    """DELETE /v1/jobs/ID as its owner: None when it is cancelled (or had ended: 409), else what went wrong."""
    try:
        reply = requests.delete(f"{url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    except requests.RequestException as exc:
        return type(exc).__name__
    return None if reply.status_code in (200, 409) else f"http {reply.status_code}"


def stop_the_rest(url: str, store: Store, keys_: dict[str, str], clients: list[threading.Thread], bound: float) -> End:
    """After the deadline: every job still waiting or running cancelled through the API, again every SWEEP_S, until
    every client has its answer and nothing waits or runs, or `bound`."""
    end, started = End(), time.monotonic()
    asked: dict[str, float] = {}  # when each job's cancel was last sent
    with ThreadPoolExecutor(max_workers=32, thread_name_prefix="cancel") as pool:
        while True:
            live = unended(store)
            alive = sum(t.is_alive() for t in clients)
            if (not live and not alive) or time.monotonic() >= bound:
                end.clients_left, end.jobs_left = alive, len(live)
                break
            now = time.monotonic()
            due = [j for j in live if now - asked.get(j, -RECANCEL_S) >= RECANCEL_S]
            for job_id, error in zip(due, pool.map(lambda j: cancel(url, keys_[live[j]], j), due)):
                asked[job_id], end.cancelled[job_id] = now, live[job_id]
                if error:
                    end.cancel_errors[error] += 1
            time.sleep(SWEEP_S)
    end.drain_s = time.monotonic() - started
    return end


def tally(jobs: list[Job], deadline: float, end: End) -> Served:
    """A user's service within the window, from its jobs' records (Redis's clock; see the module's docstring)."""
    served = Served()
    for job in jobs:
        t, usage = job.timings, job.usage
        if t.started_at is not None and t.started_at <= deadline:
            first = t.first_token_at if t.first_token_at is not None and t.first_token_at <= deadline else None
            served.runs.append((deadline - t.started_at, None if first is None else deadline - first))
        if job.status is JobStatus.COMPLETED and t.finished_at is not None and t.finished_at <= deadline:
            served.prompt += usage.prompt_tokens - usage.cached_tokens
            served.generated += usage.completion_tokens
            served.jobs += 1
        elif job.status in (JobStatus.FAILED, JobStatus.EXPIRED) and (t.finished_at or 0) <= deadline:
            served.errors[f"{job.status.value}: {job.error.type if job.error else '?'}"] += 1
        elif t.started_at is None or t.started_at > deadline:
            continue  # never ran within the window
        elif t.first_token_at is None or t.first_token_at > deadline:
            served.cut_in_prefill += 1
            served.in_prefill.append((usage.prompt_tokens - usage.cached_tokens, deadline - t.started_at))
        elif job.status in (JobStatus.COMPLETED, JobStatus.CANCELLED):
            n, finished = usage.completion_tokens, t.finished_at or deadline
            within = (
                1.0 if finished <= t.first_token_at else (deadline - t.first_token_at) / (finished - t.first_token_at)
            )
            share = 1 + (n - 1) * min(1.0, within) if n else 0.0  # its first token came within the window
            served.prompt += usage.prompt_tokens - usage.cached_tokens
            served.generated += share
            served.cut_generated += share
            served.cut += 1
            end.overshoot_s = max(end.overshoot_s, finished - deadline)
        else:
            served.errors[f"{job.status.value} after the deadline"] += 1
    longest = max((j.usage.prompt_tokens - j.usage.cached_tokens for j in jobs), default=0)
    served.in_prefill = [(n or longest, s) for n, s in served.in_prefill]  # (a user's prompts are all alike)
    return served


def owned_jobs(store: Store, outcomes: dict[str, list[Outcome]], end: End) -> dict[str, list[Job]]:
    """Each user's jobs of the run, as their records stand: those its clients were answered for (the answer names
    its job), those cancelled at the deadline, and those its listing in Redis holds (its newest 1000)."""
    ids = {o.job_id for got in outcomes.values() for o in got if o.job_id} | set(end.cancelled)
    for u in USERS:
        ids.update(store.redis.zrange(keys.user_jobs(u), 0, -1))
    jobs: dict[str, list[Job]] = {u: [] for u in USERS}
    for job in store.read(sorted(ids)).values():
        jobs[job.owner].append(job)
    return jobs


def users_file(path: Path, keys_: dict[str, str], weights: tuple[int, int]) -> Path:
    """The users file onelane reads (ONELANE_API_KEYS_FILE, tasks/users.py): each user's key and weight."""
    path.write_text("".join(f'[users.{u}]\nkey = "{keys_[u]}"\nweight = {w}\n' for u, w in zip(USERS, weights)))
    return path


def run(model: str, args: argparse.Namespace, weights: tuple[int, int], token_order: bool) -> dict[str, Any]:
    began = time.monotonic()
    keys_ = {u: f"bench-{u}-key-0123456789" for u in USERS}
    extra = {
        **queue_bounds(1000),
        "ONELANE_MAX_BATCH": str(args.batch),
        "ONELANE_MAX_TOKENS_LIMIT": "4096",
        "ONELANE_MAX_PROMPT_CHARS": "400000",
        "ONELANE_PREFIX_CACHE": "0",  # (every prompt read whole: the long user's would hit, which is its own lead)
    }
    if not token_order:
        extra |= {"ONELANE_FAIR_PROMPT_WEIGHT": "0.001", "ONELANE_FAIR_OUTPUT_WEIGHT": "0.001"}
    with bench_env(model=model) as settings:
        extra["ONELANE_API_KEYS_FILE"] = str(users_file(Path(settings.var_dir) / "keys.toml", keys_, weights))
        with onelane_stack(settings, quiet=True, **extra) as stack:
            ready_s = time.monotonic() - began
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
            outcomes: dict[str, list[Outcome]] = {u: [] for u in USERS}
            lock = threading.Lock()
            until = time.monotonic() + args.seconds
            bound = until + DRAIN_S
            threads = [
                threading.Thread(
                    target=client,
                    args=(stack.url, keys_[u], bodies[u], until, bound, outcomes[u], lock),
                    daemon=True,  # (one stuck past the bound does not hold the process)
                )
                for u in USERS
                for _ in range(args.clients)
            ]
            for t in threads:
                t.start()
            time.sleep(max(0.0, until - time.monotonic()))
            seconds, micros = store.redis.time()
            deadline = seconds + micros / 1e6  # the window's end on Redis's clock, the jobs' timings' clock
            end = stop_the_rest(stack.url, store, keys_, threads, bound)
            for t in threads:
                t.join(timeout=max(0.0, bound - time.monotonic()))
            jobs = owned_jobs(store, outcomes, end)
            served = {u: tally(jobs[u], deadline, end) for u in USERS}
            for u in USERS:
                served[u].errors.update(o.error or "?" for o in outcomes[u] if not o.ok and o.ended <= until)
            pace = json.loads(store.redis.hget(keys.model(settings.model_name), "pace") or "[0, 0, 0]")
            token_cost = float(store.redis.hget(keys.model(settings.model_name), "token_cost") or "nan")
            charged = {str(k): v for k, v in store.redis.zrange(keys.SERVICE, 0, -1, withscores=True)}
            store.redis.close()
    step_s, per_sequence_s, per_prompt_token_s = pace
    per_token_s = per_sequence_s + step_s / args.batch  # a generated token's share of a full batch's step
    device = {u: served[u].prompt * per_prompt_token_s + served[u].generated * per_token_s for u in USERS}
    # what the jobs cut in their prefill may have had, at most: their whole prompt, and no more than their time in
    # the batch (not counted: how much of it was read is not on record)
    unread = {u: sum(min(n * per_prompt_token_s, s) for n, s in served[u].in_prefill) for u in USERS}
    jain = jains(device, weights)
    total = sum(device.values())
    shares = {u: device[u] / total if total else 0.0 for u in USERS}
    ratio = (device["long"] / device["short"]) / (weights[0] / weights[1]) if device["short"] else float("nan")
    return {
        "served": served,
        "seconds": device,
        "shares": shares,
        "jain": jain,
        "unread": unread,
        "jain_unread": jains({u: device[u] + unread[u] for u in USERS}, weights),
        "ratio": ratio,
        "pace": pace,
        "token_cost": token_cost,
        "charged": charged,
        "end": end,
        "ready_s": ready_s,
        "total_s": time.monotonic() - began,
    }


def jains(device: dict[str, float], weights: tuple[int, int]) -> float:
    """Jain's index of the users' device-seconds over their weights."""
    x = [device[u] / w for u, w in zip(USERS, weights)]
    return sum(x) ** 2 / (len(x) * sum(v * v for v in x)) if any(x) else 0.0


# --- printing ------------------------------------------------------------------------------------------------


def run_lines(name: str, got: dict[str, Any], args: argparse.Namespace, weights: tuple[int, int]) -> list[str]:
    pace, end = got["pace"], got["end"]
    lines = [
        f"{name} (pace: step {pace[0] * 1000:.1f} ms, {pace[1] * 1000:.1f} ms a sequence, "
        f"{pace[2] * 1000:.2f} ms a prompt token):"
    ]
    for u in USERS:
        s = got["served"][u]
        errors = f", errors {dict(s.errors.most_common(3))}" if s.errors else ""
        lines.append(
            f"  {u:<6} {s.jobs:>4} jobs + {s.cut} cut ({s.cut_generated:.0f} of their tokens within the window; "
            f"{s.cut_in_prefill} cut in their prefill, not counted: at most {got['unread'][u]:.1f} device-s), "
            f"{s.prompt:>7} prompt tokens read, "
            f"{s.generated:>7.0f} generated, {got['seconds'][u]:7.1f} device-s ({got['shares'][u]:.0%}){errors}"
        )
    long_runs = sorted(got["served"]["long"].runs, reverse=True)
    lines.append(
        "  long's jobs: started, first token (s into the window): "
        + ", ".join(f"{args.seconds - a:.0f}/{'-' if b is None else f'{args.seconds - b:.0f}'}" for a, b in long_runs)
    )
    lines.append(
        f"  Jain's index of device-seconds over weight: {got['jain']:.3f} ({got['jain_unread']:.3f} if the jobs cut "
        f"in their prefill had had their most); {ratio_line(got['ratio'], weights)}"
    )
    lines.append(
        f"  the order's own account (token units its ended jobs were charged, before weight; output weight "
        f"{got['token_cost']:.2f} at the end): " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(got["charged"].items()))
    )
    cancel_errors = f" (cancels that failed: {dict(end.cancel_errors)})" if end.cancel_errors else ""
    left = (
        f"; AT THE BOUND {end.clients_left} clients still waiting, {end.jobs_left} jobs not ended"
        if end.clients_left or end.jobs_left
        else ""
    )
    lines.append(
        f"  end: {len(end.cancelled)} jobs cancelled at the deadline{cancel_errors}, all ended and answered "
        f"{end.drain_s:.1f} s after it (a cut job ended at most {end.overshoot_s:.1f} s after it){left}; the order "
        f"took {got['total_s']:.0f} s in all ({got['ready_s']:.0f} s to start the stack, {args.seconds:.0f} s window)"
    )
    return lines


def ratio_line(ratio: float, weights: tuple[int, int]) -> str:
    """The users' device-seconds' ratio over their weights' ratio, and whether it is within TOLERANCE of it."""
    within = abs(ratio - 1) <= TOLERANCE
    return (
        f"long/short device-seconds {ratio * weights[0] / weights[1]:.2f}:1 against weights {weights[0]}:{weights[1]}"
        f" = {ratio:.2f} of the weights' ratio, {'within' if within else 'NOT within'} {TOLERANCE:.0%} of "
        f"{weights[0]}:{weights[1]}"
    )


def spread(values: list[float], fmt: str) -> str:
    """The median with min-max: "M (A-B)"."""
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def summary_lines(runs: dict[str, list[dict[str, Any]]], weights: tuple[int, int]) -> list[str]:
    n = len(next(iter(runs.values())))
    lines = [f"over {n} rounds, median (min-max):"]
    for name, got in runs.items():
        ratios = [g["ratio"] for g in got]
        median_ratio = statistics.median(ratios)
        lines.append(
            f"  {name:<16} Jain's index {spread([g['jain'] for g in got], '{:.3f}')}; share long "
            f"{spread([g['shares']['long'] * 100 for g in got], '{:.0f}')} %, short "
            f"{spread([g['shares']['short'] * 100 for g in got], '{:.0f}')} %; device-seconds long/short over "
            f"{weights[0]}:{weights[1]} {spread(ratios, '{:.2f}')}, the median "
            f"{'within' if abs(median_ratio - 1) <= TOLERANCE else 'NOT within'} {TOLERANCE:.0%} "
            f"({sum(abs(r - 1) <= TOLERANCE for r in ratios)} of {n} rounds within)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_option(parser)
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--long-prompt", type=int, default=2000)
    parser.add_argument("--long-answer", type=int, default=512)
    parser.add_argument("--short-answer", type=int, default=64)
    parser.add_argument(
        "--weights", default="1,1", help="the long user's and the short user's weights, whole numbers 1-100"
    )
    parser.add_argument("--rounds", type=int, default=1, help="both orders this many times, alternating which first")
    parser.add_argument(
        "--only-tokens", action="store_true", help="the token order alone (a longer window for the weights' check)"
    )
    args = parser.parse_args()
    weights = tuple(int(w) if w.strip().isdigit() else 0 for w in args.weights.split(","))
    if len(weights) != 2 or not all(1 <= w <= 100 for w in weights) or args.rounds < 1:
        parser.error("--weights takes two whole numbers from 1 to 100, --rounds at least 1")
    orders = ORDERS[1:] if args.only_tokens else ORDERS
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in orders}
    with tempfile.TemporaryDirectory(prefix="onelane-bench-model-") as tmp:
        model = str(model_folder(args.model, Path(tmp)))
        print(
            f"model {args.model}; {args.clients} clients a user, batch {args.batch}, {args.seconds:.0f} s an order "
            f"(then at most {DRAIN_S:.0f} s to cancel what is left); weights long:short {weights[0]}:{weights[1]} "
            f"(users file); {args.rounds} round(s); load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        for r in range(args.rounds):
            for name, token_order in orders if r % 2 == 0 else orders[::-1]:
                got = run(model, args, weights, token_order)  # type: ignore[arg-type]
                runs[name].append(got)
                print(f"\nround {r + 1}: " + "\n".join(run_lines(name, got, args, weights)), flush=True)  # type: ignore[arg-type]
    print()
    print("\n".join(summary_lines(runs, weights)))  # type: ignore[arg-type]
    print(f"load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
