"""onelane under the same overload as mlx_lm.server (mlx_server.py probes it): 64 clients at once asking for 1000 tokens
each with a 3 s timeout, a queue bound of 16, then a 1-token request; the jobs are read back from Redis to see what the
worker did for the clients that had gone, and printed. Used by compare_servers.py; also its requests to onelane, the
baseline's chat request with onelane's `ignore_eos` (and a `seed` that tags a job with its client)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.harness import poll_until
from bench.mlx_server import body
from bench.openai_load import (
    OVERLOAD_CAP_S,
    OVERLOAD_CLIENTS,
    OVERLOAD_HEAD,
    OVERLOAD_TIMEOUT_S,
    OVERLOAD_TOKENS,
    PROMPTS,
    SETTLE_S,
    Outcome,
    aftermath,
    burst,
    post_chat,
)
from bench.proc import proc_cpu, wait_idle
from bench.report import ms, pct
from tasks import keys
from tasks.store import Store

# --- the probe ----------------------------------------------------------------------------------------------------


def onelane_body(
    model: str, prompt: str, max_tokens: int, stream: bool = False, tag: int | None = None
) -> dict[str, Any]:
    """The same chat request the baseline sends, with onelane's `ignore_eos` instead of a logit bias.

    `tag` goes in `seed`, which does not change a temperature-0 answer; it lets a job be matched to its client.
    """
    request = {**body(prompt, max_tokens, None), "model": model, "stream": stream, "ignore_eos": True}
    if tag is not None:
        request["seed"] = tag
    return request


def settle_queue(store: Store, timeout_s: float = SETTLE_S) -> bool:
    """Wait (bounded) until nothing waits and nothing runs."""

    def idle() -> bool:
        snap = store.readings.snapshot()
        return snap.queue_depth == 0 and snap.in_progress == 0

    return bool(poll_until(idle, timeout_s))


def holder_pid(store: Store) -> int | None:
    workers = store.readings.snapshot().workers
    return workers[0].pid if workers else None


def onelane_overload(url: str, model: str, store: Store) -> dict[str, Any]:
    """The baseline's probe against onelane, then the jobs read back from Redis."""
    settled = settle_queue(store)
    pid = holder_pid(store)
    if pid is not None:
        settled = settled and wait_idle(pid, time.monotonic() + SETTLE_S) is not None
    cpu_before = proc_cpu(pid) if pid else None
    to_wall = time.time() - time.monotonic()
    burst_requests = [onelane_body(model, PROMPTS[0], OVERLOAD_TOKENS, tag=n) for n in range(OVERLOAD_CLIENTS)]
    outcomes, started, gave_up = burst(lambda n: post_chat(url, burst_requests[n], OVERLOAD_TIMEOUT_S))
    deadline = started + OVERLOAD_CAP_S
    fresh_request = {**onelane_body(model, PROMPTS[1], 1), "ignore_eos": False}  # as the baseline's: EOS allowed
    idle_at, fresh = aftermath(pid, deadline, lambda timeout_s: post_chat(url, fresh_request, timeout_s))
    cpu_after = proc_cpu(pid) if pid else None
    drained = settle_queue(store, max(1.0, deadline - time.monotonic()))

    # read the probe's jobs back: the newest of the local user's, tagged by seed, asking for OVERLOAD_TOKENS
    burst_wall = started + to_wall
    jobs = {}
    for job in store.list("local", 200):
        seed = job.spec.params.seed
        if (
            job.timings.queued_at >= burst_wall - 1
            and job.spec.params.max_tokens == OVERLOAD_TOKENS
            and seed is not None
        ):
            raw = store.redis.hmget(keys.job(job.id), "cancel_requested", "last_token_at")
            jobs[seed] = (job, raw[0], raw[1])
    return {
        "outcomes": outcomes,
        "jobs": jobs,
        "to_wall": to_wall,
        "started": started,
        "gave_up": gave_up,
        "gave_up_after_s": gave_up - started,
        "settled_before": settled,
        "drained": drained,
        "busy_after_give_up_s": None if idle_at is None else max(0.0, idle_at - gave_up),
        "still_busy_at_cap": idle_at is None and pid is not None,
        "cpu_s": None if cpu_before is None or cpu_after is None else cpu_after - cpu_before,
        "fresh_request": fresh,
    }


@dataclass
class Abandoned:
    """What the worker did for clients that timed out, from the jobs in Redis."""

    jobs: int = 0  # admitted jobs whose client timed out
    started: int = 0  # ... that started generating at all
    started_after_gone: int = 0  # ... that started after their client had gone
    tokens: int = 0  # completion tokens spent on them
    tokens_after_cancel: int = 0  # ... generated after the web had flagged the cancel
    statuses: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    gone_to_end: list[float] = field(default_factory=list)  # seconds from client gone to its job ended
    last_token_after_give_up: float | None = None  # last token of any of them, after the last client gave up
    examples: list[str] = field(default_factory=list)


def abandoned(probe: dict[str, Any]) -> Abandoned:
    out = Abandoned()
    to_wall = probe["to_wall"]
    gave_up_wall = probe["gave_up"] + to_wall
    for o in probe["outcomes"]:
        if o.ok or o.status is not None or o.tag not in probe["jobs"]:
            continue  # answered, rejected, or never admitted
        job, cancel_at_tokens, last_token_at = probe["jobs"][o.tag]
        gone = o.ended + to_wall
        out.jobs += 1
        out.statuses[job.status.value] += 1
        if job.error:
            out.errors[job.error.type] += 1
        out.tokens += job.usage.completion_tokens
        if cancel_at_tokens is not None:
            out.tokens_after_cancel += job.usage.completion_tokens - int(cancel_at_tokens)
        if job.timings.started_at is not None:
            out.started += 1
            if job.timings.started_at > gone:
                out.started_after_gone += 1
                out.examples.append(
                    f"{job.id}: client gone at {gone:.3f}, started {job.timings.started_at:.3f}, "
                    f"{job.usage.completion_tokens} tokens, {job.status.value}"
                )
        if job.timings.finished_at is not None:
            out.gone_to_end.append(job.timings.finished_at - gone)
        if last_token_at:
            after = float(last_token_at) - gave_up_wall
            out.last_token_after_give_up = max(after, out.last_token_after_give_up or after)
    return out


# --- printing -----------------------------------------------------------------------------------------------------


def onelane_overload_lines(probe: dict[str, Any], ab: Abandoned) -> list[str]:
    """The printed lines of onelane's overload probe."""
    head = f"onelane {OVERLOAD_HEAD}"
    lines = [] if probe["settled_before"] else [f"{head} WARNING: worker still busy with earlier requests at start"]
    lines += burst_lines(probe, head) + abandoned_lines(ab, head) + aftermath_lines(probe, head)
    for example in ab.examples[:5]:
        lines.append(f"{head} SUSPICIOUS: {example}")
    lines += timeline(probe, head)
    if not probe["drained"]:
        lines.append(f"{head} WARNING: queue not drained by the {OVERLOAD_CAP_S:.0f} s cap")
    return lines


def burst_lines(probe: dict[str, Any], head: str) -> list[str]:
    """How the burst's requests were answered, rejected or timed out, and how many jobs it left."""
    outcomes: list[Outcome] = probe["outcomes"]
    ok = [o for o in outcomes if o.ok]
    rejected = [o for o in outcomes if o.status in (429, 503)]
    other_http = [o for o in outcomes if o.status is not None and not o.ok and o.status not in (429, 503)]
    timeouts = [o for o in outcomes if o.status is None]
    with_ra = [o for o in rejected if o.retry_after]
    shaped = sum(1 for o in rejected if o.json_error)
    return [
        f"{head} answered {len(ok)}, rejected {len(rejected)} "
        f"({', '.join(f'{k} {n}' for k, n in Counter(f'{o.status} {o.error_type}' for o in rejected).items()) or '-'}),"
        f" timed out/no answer {len(timeouts)} ({', '.join(f'{k} {n}' for k, n in Counter(o.error for o in timeouts).items()) or '-'})"
        + (f", other HTTP {Counter(o.status for o in other_http)}" if other_http else ""),
        (
            f"{head} Retry-After on {len(with_ra)} of {len(rejected)} rejections (values {sorted({o.retry_after for o in with_ra}) or '-'});"
            f" OpenAI error JSON on {shaped} of {len(rejected)}; rejections answered in p50 "
            f"{ms(pct([o.latency for o in rejected], 50) if rejected else None)} ms"
        ),
        (
            f"{head} last client gave up {probe['gave_up_after_s']:.2f} s after the burst; {len(probe['jobs'])} jobs were "
            f"admitted, {sum(1 for j, _, _ in probe['jobs'].values() if j.timings.started_at is not None)} started generating"
        ),
    ]


def abandoned_lines(ab: Abandoned, head: str) -> list[str]:
    """What the worker did for the admitted clients that timed out."""
    last = ab.last_token_after_give_up
    return [
        (
            f"{head} jobs of the {ab.jobs} admitted clients that timed out: {ab.started} started at all, "
            f"{ab.started_after_gone} started after their client had gone; statuses {dict(ab.statuses)}, "
            f"errors {dict(ab.errors)}"
        ),
        (
            f"{head} completion tokens spent on them: {ab.tokens} in all, {ab.tokens_after_cancel} after the web flagged "
            f"the cancel; client gone -> job ended p50 {ms(pct(ab.gone_to_end, 50) if ab.gone_to_end else None)} ms, "
            f"max {ms(max(ab.gone_to_end) if ab.gone_to_end else None)} ms"
        ),
        f"{head} last token generated for a departed client: "
        + ("none" if last is None else f"{last:+.2f} s relative to the last client giving up"),
    ]


def aftermath_lines(probe: dict[str, Any], head: str) -> list[str]:
    """After the clients gave up: how long the worker stayed busy, the next request, the first queue place freed."""
    lines = []
    busy = probe["busy_after_give_up_s"]
    cpu = f"{probe['cpu_s']:.1f} s worker CPU" if probe["cpu_s"] is not None else "CPU time unavailable"
    if busy is not None:
        lines.append(
            f"{head} worker CPU idle {busy:.2f} s after the last client gave up ({cpu} in all; the 1-token "
            "request below runs in that window too)"
        )
    elif probe["still_busy_at_cap"]:
        lines.append(f"{head} worker still busy when the {OVERLOAD_CAP_S:.0f} s cap ended the probe ({cpu})")
    fresh: Outcome | None = probe["fresh_request"]
    if fresh is not None:
        state = "answered" if fresh.ok else f"failed ({fresh.error}, Retry-After {fresh.retry_after})"
        lines.append(f"{head} a 1-token request sent right after they gave up {state} in {fresh.latency:.2f} s")
    freed = first_place_freed(probe)
    if freed is not None:
        lines.append(
            f"{head} the last rejection arrived at +{freed[0]:.2f} s; the first queue place freed (a waiting "
            f"job started or was cancelled) at +{freed[1]:.2f} s"
        )
    return lines


def first_place_freed(probe: dict[str, Any]) -> tuple[float, float] | None:
    """(when the last rejected answer arrived, when a waiting job next left the queue), seconds after the burst."""
    base = probe["started"] + probe["to_wall"]
    rejected = [o.ended + probe["to_wall"] for o in probe["outcomes"] if o.status in (429, 503)]
    if not rejected:
        return None
    last = max(rejected)
    left = [
        j.timings.started_at if j.timings.started_at is not None else j.timings.finished_at
        for j, _, _ in probe["jobs"].values()
    ]
    later = [t for t in left if t is not None and t > last]
    return (last - base, min(later) - base) if later else None


def timeline(probe: dict[str, Any], head: str) -> list[str]:
    """Every probe job that started generating, in seconds after the burst (Redis's clock, same machine)."""
    base = probe["started"] + probe["to_wall"]
    ended = {
        o.tag: (o.ended + probe["to_wall"], "answered" if o.ok else o.error or f"http {o.status}")
        for o in probe["outcomes"]
        if o.tag is not None
    }
    lines = []
    started = sorted(
        (j for j, _, _ in probe["jobs"].values() if j.timings.started_at is not None),
        key=lambda j: j.timings.started_at or 0.0,
    )
    for job in started:
        t = job.timings

        def rel(v: float | None) -> str:
            return "-" if v is None else f"{v - base:+.2f}"

        lines.append(
            f"{head}   job seed={job.spec.params.seed}: queued {rel(t.queued_at)} s, started {rel(t.started_at)},"
            f" first token {rel(t.first_token_at)}, ended {rel(t.finished_at)} {job.status.value}"
            f" ({job.usage.completion_tokens} tokens); its client: {ended[job.spec.params.seed][1]} at "
            f"{rel(ended[job.spec.params.seed][0])}"
        )
    return lines


@dataclass
class OverloadRow:
    answered: int
    rejected: str
    timed_out: int
    for_nobody: str
    busy_after: str
    fresh: str


def overload_row(probe: dict[str, Any], for_nobody: int) -> OverloadRow:
    """One server's overload cells; `for_nobody`: the tokens it spent on clients that had gone."""
    outcomes: list[Outcome] = probe["outcomes"]
    rejected = [o for o in outcomes if o.status in (429, 503)]
    ra = sum(1 for o in rejected if o.retry_after)
    fresh = probe["fresh_request"]
    busy = probe["busy_after_give_up_s"]
    return OverloadRow(
        sum(1 for o in outcomes if o.ok),
        f"{len(rejected)} (RA {ra})",
        sum(1 for o in outcomes if o.status is None),
        str(for_nobody),
        "-" if busy is None else f"{busy:.1f}",
        "-" if fresh is None else f"{fresh.latency:.2f}" + ("" if fresh.ok else f" {fresh.error}"),
    )
