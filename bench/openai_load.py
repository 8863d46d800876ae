"""Load through POST /v1/chat/completions, the same against onelane and mlx_lm.server: closed-loop clients at a
level of concurrency, and an overload burst followed by a fresh request while the server's CPU is watched."""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests

from bench.proc import wait_idle

PROMPTS = [
    "Tell me a joke about queues.",
    "Write a short story about a patient robot.",
    "How long will I wait in line?",
    "Explain what a GPU does, in one paragraph.",
    "List five numbers and say why you like them.",
    "What can I help you with today?",
    "Describe the quick brown fox.",
    "Why does the worker never work for nobody?",
]
LEVELS = (1, 8, 32)
MAX_TOKENS = 64
MIN_REQUESTS = (
    128  # per level: enough samples at 1 client, at least 4 rounds per client at 32 (levels of ~1 s are noise here)
)
LEVEL_DEADLINE_S = 60.0
REQUEST_TIMEOUT_S = 60.0
OVERLOAD_CLIENTS = 64
OVERLOAD_TOKENS = 1000
OVERLOAD_TIMEOUT_S = 3.0
OVERLOAD_CAP_S = 120.0  # the whole probe, from the first request until the server is idle or we give up
OVERLOAD_HEAD = f"overload ({OVERLOAD_CLIENTS} clients x {OVERLOAD_TOKENS} tokens, {OVERLOAD_TIMEOUT_S:.0f} s timeout):"
SETTLE_S = 60.0  # longest wait for leftovers of one phase (requests we timed out) before the next


@dataclass
class Outcome:
    """One request: ok or the reason it failed, its latency, the token counts it reported, and what onelane adds
    (job id, queue time, finish reason, its error's shape and type)."""

    ok: bool
    latency: float
    error: str | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    status: int | None = None
    retry_after: str | None = None
    ended: float = 0.0  # time.monotonic() when the client got its answer or gave up
    job_id: str | None = None
    queue_s: float | None = None
    finish_reason: str | None = None
    json_error: bool | None = None  # non-200: the body is OpenAI's {"error": {"type", "message"}}
    error_type: str | None = None  # the error's `code` (onelane's own error type), else its `type`
    tag: int | None = None  # the request's `seed`, which matches a onelane job to its client


@dataclass
class Level:
    """Every outcome at one concurrency, and the wall time they took."""

    clients: int
    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.ok]


def classify(exc: requests.RequestException) -> str:
    """A short name for why a request failed: timeout (connect/read), reset, refused or disconnected."""
    if isinstance(exc, requests.ConnectTimeout):
        return "connect timeout"
    if isinstance(exc, requests.Timeout):
        return "read timeout"
    text = repr(exc)
    for needle, name in (("Reset", "reset"), ("Refused", "refused"), ("RemoteDisconnected", "disconnected")):
        if needle in text:
            return name
    return type(exc).__name__


def post_chat(url: str, request: dict[str, Any], timeout_s: float, headers: dict[str, str] | None = None) -> Outcome:
    """POST one chat completion; never raises for network or HTTP errors."""
    tag = request.get("seed")
    started = time.monotonic()
    try:
        reply = requests.post(f"{url}/v1/chat/completions", json=request, timeout=timeout_s, headers=headers)
    except requests.RequestException as exc:
        ended = time.monotonic()
        return Outcome(False, ended - started, classify(exc), ended=ended, tag=tag)
    ended = time.monotonic()
    common: dict[str, Any] = {
        "status": reply.status_code,
        "retry_after": reply.headers.get("Retry-After"),
        "ended": ended,
        "job_id": reply.headers.get("x-onelane-job-id"),
        "tag": tag,
    }
    try:
        data = reply.json()
    except ValueError:
        data = None
    if reply.status_code != 200:
        err = data.get("error") if isinstance(data, dict) else None
        shaped = isinstance(err, dict) and isinstance(err.get("type"), str) and isinstance(err.get("message"), str)
        return Outcome(
            False,
            ended - started,
            f"http {reply.status_code}",
            json_error=shaped,
            error_type=str(err.get("code") or err["type"]) if shaped else None,
            **common,
        )  # type: ignore[union-attr]
    if not isinstance(data, dict):
        return Outcome(False, ended - started, "200 without JSON", json_error=False, **common)
    usage = data.get("usage") or {}
    queue = reply.headers.get("x-queue-time")
    return Outcome(
        True,
        ended - started,
        None,
        completion_tokens=int(usage.get("completion_tokens", 0)),
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        cached_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)),
        finish_reason=(data.get("choices") or [{}])[0].get("finish_reason"),
        queue_s=float(queue) if queue else None,
        **common,
    )


def closed_loop(clients: int, send: Callable[[str], Outcome], requests: int = MIN_REQUESTS) -> Level:
    """`clients` closed-loop clients at once, each sending `send(prompt)` back to back: `requests` in all (at least
    2 each), none started after LEVEL_DEADLINE_S."""
    rounds = max(2, math.ceil(requests / clients))
    deadline = time.monotonic() + LEVEL_DEADLINE_S

    def client(c: int) -> list[Outcome]:
        out: list[Outcome] = []
        for i in range(rounds):
            if time.monotonic() > deadline:
                break
            out.append(send(PROMPTS[(c * rounds + i) % len(PROMPTS)]))
        return out

    level = Level(clients)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        for future in [pool.submit(client, c) for c in range(clients)]:
            level.outcomes.extend(future.result())
    level.wall_s = time.monotonic() - started
    return level


def burst(send: Callable[[int], Outcome]) -> tuple[list[Outcome], float, float]:
    """OVERLOAD_CLIENTS requests at once (past a barrier), client n sending `send(n)`: (their outcomes, when they
    started, when the last one got its answer or gave up)."""
    barrier = threading.Barrier(OVERLOAD_CLIENTS, timeout=30)

    def one(n: int) -> Outcome:
        barrier.wait()
        return send(n)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=OVERLOAD_CLIENTS) as pool:
        outcomes = list(pool.map(one, range(OVERLOAD_CLIENTS)))
    return outcomes, started, max(o.ended for o in outcomes)


def aftermath(
    pid: int | None, deadline: float, fresh: Callable[[float], Outcome]
) -> tuple[float | None, Outcome | None]:
    """Right after a burst: a fresh request, `fresh(timeout_s)` (what the next user waits), while `pid`'s CPU is
    watched until it idles: (when it went idle, or None by `deadline`; the fresh request's outcome)."""
    answer: list[Outcome] = []
    prober = threading.Thread(target=lambda: answer.append(fresh(max(1.0, deadline - time.monotonic()))))
    prober.start()
    idle_at = wait_idle(pid, deadline) if pid else None
    prober.join(timeout=max(0.0, deadline - time.monotonic()) + 5)
    return idle_at, answer[0] if answer else None


def level_lines(server: str, level: Level, details: Callable[[list[Outcome]], tuple[str, str]]) -> list[str]:
    """The printed lines of one level: what was sent and how it went; with answers, `details(ok)` (a latency line
    and a usage line) around the throughput."""
    ok, failed = level.ok, [o for o in level.outcomes if not o.ok]
    errors = ", ".join(f"{name} {n}" for name, n in Counter(o.error for o in failed).most_common()) or "none"
    head = f"{server} c={level.clients}:"
    lines = [f"{head} sent {len(level.outcomes)}, ok {len(ok)}, failed {len(failed)} ({errors})"]
    if ok:
        latency, usage = details(ok)
        tokens = sum(o.completion_tokens for o in ok)
        lines += [
            f"{head} {latency}",
            f"{head} {len(ok) / level.wall_s:.2f} req/s, {tokens / level.wall_s:.1f} completion tok/s over "
            f"{level.wall_s:.2f} s",
            f"{head} {usage}",
        ]
    return lines


@dataclass
class Streamed:
    """One streamed answer: time to the first non-empty content delta, to the end, what came, and its usage (the
    last chunk's, with stream_options.include_usage)."""

    ttft: float | None
    total: float
    content_chunks: int
    done: bool
    error: str | None
    text: str = ""
    usage: dict[str, Any] | None = None


class StreamTooSlow(Exception):
    """A stream still ran past its deadline."""


def stream_once(url: str, request: dict[str, Any], timeout_s: float, headers: dict[str, str] | None = None) -> Streamed:
    """POST with "stream": true and read the SSE as it arrives; never raises for network or HTTP errors."""
    parts = urlsplit(url)
    payload = json.dumps(request).encode()
    started = time.monotonic()
    got = Streamed(None, 0.0, 0, False, None)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout_s)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=payload,
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        resp = conn.getresponse()
        if resp.status != 200:
            return Streamed(None, time.monotonic() - started, 0, False, f"http {resp.status}")
        read_chunks(resp, got, started, started + timeout_s)
    except StreamTooSlow:
        got.error = "stream too slow"
    except (OSError, http.client.HTTPException, ValueError) as exc:
        got.error = type(exc).__name__
    finally:
        conn.close()
    if not got.done and got.error is None:
        got.error = "stream ended without [DONE]"
    got.total = time.monotonic() - started
    return got


def read_chunks(resp: http.client.HTTPResponse, got: Streamed, started: float, deadline: float) -> None:
    """The stream's chunks into `got` as they come, to [DONE] or an error event."""
    for payload in sse_payloads(resp, deadline):
        if payload == b"[DONE]":
            got.done = True
            return
        chunk = json.loads(payload)
        if "error" in chunk:
            got.error = f"error event: {chunk['error']}"
            return
        got.usage = chunk.get("usage") or got.usage
        for content in contents(chunk):
            got.content_chunks += 1
            got.text += content
            if got.ttft is None:
                got.ttft = time.monotonic() - started


def sse_payloads(resp: http.client.HTTPResponse, deadline: float = math.inf, reads: int = 100_000) -> Iterator[bytes]:
    """The payload of each `data:` line of a server-sent event stream as it arrives (read1: no waiting for a full
    buffer), to the end of the body; bounded by `reads` (a 64-token stream takes well under 1000) and by `deadline`
    (monotonic), past which it raises StreamTooSlow."""
    buffer = b""
    for _ in range(reads):
        if time.monotonic() > deadline:
            raise StreamTooSlow
        data = resp.read1(65536)
        if not data:
            return
        *lines, buffer = (buffer + data).split(b"\n")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:"):
                yield line[5:].strip()


def contents(chunk: dict[str, Any]) -> list[str]:
    """The non-empty content deltas of a chat completion chunk."""
    return [c for choice in chunk.get("choices") or [] if (c := (choice.get("delta") or {}).get("content"))]
