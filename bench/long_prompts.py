"""Long prompts while streams decode (issue 51): the streams' inter-token gaps while four ~6,000-token prompts are
read, onelane with no decode floor (ONELANE_DECODE_FLOOR=0), onelane as shipped (its default floor, 4 tokens/s), and
mlx_lm.server on the same model folder and load, same run.

    ./dev.sh bench long_prompts [--model smollm2|demo|PATH] [--rounds 1] [--streams 8] [--stream-tokens 512]
                                [--long 4] [--long-tokens 6000] [--long-max-tokens 8] [--tail 16] [--batch 16]
                                [--timeout 1800]

Each round, each system in turn (the order rotating round by round), on a fresh server: onelane (Redis, `onelane
worker`, `onelane web`, ONELANE_MAX_BATCH=--batch, wide queue bounds) "before" with ONELANE_DECODE_FLOOR=0 and
"after" without it set (its default), then mlx_lm.server (bench/mlx_server.py: OpenBLAS preloaded as onelane's
worker has it, not onelane's shim; its own defaults: a continuous batch, prompts read 2,048 tokens a chunk). After two
short warm-up requests:

1. --streams clients each stream a chat answer (`stream: true`, a short prompt of its own, --stream-tokens tokens);
2. once every stream has its first token, --long clients at once each stream a question after a long prompt of
   about --long-tokens tokens (the model's chat template counted by its own tokenizer; each prompt begins
   differently, so that no prefix cache answers one from another; --long-max-tokens tokens);
3. once every long request has ended, each stream reads --tail more chunks and hangs up (so that the run lasts as
   long as the long prompts, not as --stream-tokens).

Every request is greedy and runs to its max_tokens: `ignore_eos` on onelane, the model's EOS pushed down with
logit_bias on mlx_lm.server (it has no ignore_eos; bench/mlx_server.py does the same). Timestamps are this process's,
taken as each content chunk arrives. The window: from the long requests sent until the last of them has its first
content chunk (all four prompts read). Printed per system and round: the window's length; the long requests' TTFT
p50 and max and their prompt tokens (as the server counted them); the streams' gaps between two content chunks that
overlap the window, p50, p99 and max over all streams, and each stream's worst one (p50 over streams); every gap of
the streams from their first chunk to their last (overall) p50, p99 and max; the gaps after the window (the long
answers decoding, no prompt read) p50; the chunks each stream got in the window (median); how many streams decoded
through the whole window (a chunk before it and one after: if few did, the gap figures say little); failures by kind.
Then per figure the median (min-max) over the rounds of each system, and the per-round ratios onelane / mlx_lm.server
and after / before. Every figure is measured in this run; every process started is stopped before it returns.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.chat_servers import system_message
from bench.harness import add_model_option, bench_env, model_folder, onelane_stack, prompt, queue_bounds, rotated
from bench.mlx_server import eos_id, mlx_server
from bench.openai_load import PROMPTS, StreamTooSlow, contents, post_chat, sse_payloads
from bench.report import pct, span
from tasks.settings import ENV_NAMES

SETTING = "ONELANE_DECODE_FLOOR"
BEFORE, AFTER, PEER = "onelane, no floor", "onelane", "mlx_lm.server"
SYSTEMS = (BEFORE, AFTER, PEER)
FIRST_TOKENS_S = 300.0  # longest wait for every stream's first token before the long prompts are sent
CHARS_PER_TOKEN = 4.6  # SmolLM2's tokenizer on system_message's English: the first guess, which the tokenizer corrects


@dataclass
class Stream:
    """One streamed request as it went: when it was sent and ended, each content chunk's arrival (all
    time.monotonic()), the prompt tokens its usage reported, its failure, and whether this client hung up."""

    sent: float = 0.0
    arrivals: list[float] = field(default_factory=list)
    ended: float = 0.0
    prompt_tokens: int | None = None
    error: str | None = None
    hung_up: bool = False
    first: threading.Event = field(default_factory=threading.Event)  # set at its first chunk or its end

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        return self.arrivals[0] - self.sent if self.arrivals else None

    def gaps(self) -> list[tuple[float, float]]:
        """(earlier, later) arrival of each two consecutive content chunks."""
        return list(zip(self.arrivals, self.arrivals[1:]))


def stream_chat(
    url: str,
    request: dict[str, Any],
    stream: Stream,
    timeout_s: float,
    stop: threading.Event | None = None,
    tail: int = 0,
) -> None:
    """POST a streamed chat completion and record its chunks into `stream` as they arrive, to [DONE], or (once
    `stop` is set) `tail` more chunks, then hang up; never raises."""
    parts = urlsplit(url)
    body = json.dumps({**request, "stream": True, "stream_options": {"include_usage": True}}).encode()
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout_s)
    stream.sent, done, usage, stopped_at = time.monotonic(), False, None, None
    try:
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            stream.error = f"http {response.status}"
            return
        for payload in sse_payloads(response, stream.sent + timeout_s):
            if payload == b"[DONE]":
                done = True
                break
            chunk = json.loads(payload)
            if "error" in chunk:
                error = chunk["error"]
                stream.error = f"error event: {error.get('message') if isinstance(error, dict) else error}"[:90]
                break
            usage = chunk.get("usage") or usage
            for _ in contents(chunk):
                stream.arrivals.append(time.monotonic())
                stream.first.set()
            if stop is not None and stop.is_set():
                stopped_at = len(stream.arrivals) if stopped_at is None else stopped_at
                if len(stream.arrivals) - stopped_at >= tail:
                    stream.hung_up = True
                    break
        if not done and not stream.hung_up and stream.error is None:
            stream.error = "ended without [DONE]"
    except StreamTooSlow:
        stream.error = "timeout"
    except (OSError, http.client.HTTPException, ValueError) as exc:
        stream.error = type(exc).__name__
    finally:
        conn.close()
        stream.ended = time.monotonic()
        stream.prompt_tokens = (usage or {}).get("prompt_tokens")
        stream.first.set()


@dataclass
class Run:
    """One system's round: its streams, its long requests and the wall time."""

    system: str
    streams: list[Stream]
    longs: list[Stream]
    wall_s: float
    alive: bool = True

    @property
    def window(self) -> tuple[float, float]:
        """From the first long request sent to the last one's first chunk (its end, if it failed before one)."""
        return min(s.sent for s in self.longs), max(s.arrivals[0] if s.arrivals else s.ended for s in self.longs)

    def window_s(self) -> float:
        w0, w1 = self.window
        return w1 - w0

    def _gaps(self, keep: Callable[[float, float], bool]) -> list[list[float]]:
        """Each stream that did not fail: its gaps that `keep(earlier, later)` takes."""
        return [[b - a for a, b in s.gaps() if keep(a, b)] for s in self.streams if s.ok]

    def in_window(self) -> list[list[float]]:
        w0, w1 = self.window
        return self._gaps(lambda a, b: b > w0 and a < w1)

    def gap(self, which: str, q: float) -> float | None:
        """The q-th percentile of every stream's gaps: `window` (overlapping it), `all`, or `after` it."""
        w1 = self.window[1]
        if which == "window":
            per = self.in_window()
        elif which == "after":
            per = self._gaps(lambda a, b: a >= w1)
        else:
            per = self._gaps(lambda a, b: True)
        flat = [g for gaps in per for g in gaps]
        return pct(flat, q) if flat else None

    def worst(self, q: float) -> float | None:
        """The q-th percentile over the streams of each one's longest gap overlapping the window."""
        worst = [max(gaps) for gaps in self.in_window() if gaps]
        return pct(worst, q) if worst else None

    def chunks_in_window(self) -> float | None:
        w0, w1 = self.window
        counts = [sum(1 for t in s.arrivals if w0 < t <= w1) for s in self.streams if s.ok]
        return statistics.median(counts) if counts else None

    def through(self) -> int:
        """Streams that decoded through the whole window (a chunk before it and one after)."""
        w0, w1 = self.window
        return sum(1 for s in self.streams if s.ok and s.arrivals and s.arrivals[0] <= w0 and s.arrivals[-1] >= w1)

    def long_ttft(self, q: float) -> float | None:
        ttfts = [t for s in self.longs if s.ok and (t := s.ttft) is not None]
        return pct(ttfts, q) if ttfts else None

    def failures(self) -> Counter[str]:
        failed: Counter[str] = Counter(f"stream {s.error}" for s in self.streams if not s.ok)
        failed.update(f"long {s.error}" for s in self.longs if not s.ok)
        return failed


def workload(url: str, common: dict[str, Any], args: argparse.Namespace, longs: list[str], system: str) -> Run:
    """The streams, then (once each has its first token) the long requests, all at once; once those have ended,
    the streams hang up after --tail more chunks."""
    streams = [Stream() for _ in range(args.streams)]
    asks = [Stream() for _ in longs]
    stop = threading.Event()
    stories = [f"Stream {c + 1}: tell a long story about {prompt(c, 8)}." for c in range(args.streams)]
    stream_bodies = [{**common, "messages": _user(text), "max_tokens": args.stream_tokens} for text in stories]
    long_bodies = [{**common, "messages": _user(text), "max_tokens": args.long_max_tokens} for text in longs]
    threads = [
        threading.Thread(target=stream_chat, args=(url, b, s, args.timeout, stop, args.tail), name=f"stream-{n}")
        for n, (b, s) in enumerate(zip(stream_bodies, streams))
    ]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + FIRST_TOKENS_S
    for s in streams:
        s.first.wait(max(0.0, deadline - time.monotonic()))
    if not all(s.arrivals for s in streams):
        print(f"  ! {sum(1 for s in streams if not s.arrivals)} streams had no first token: sent regardless")
    go = threading.Barrier(len(longs))

    def ask(body: dict[str, Any], s: Stream) -> None:
        go.wait()
        stream_chat(url, body, s, args.timeout)

    long_threads = [
        threading.Thread(target=ask, args=(b, s), name=f"long-{n}") for n, (b, s) in enumerate(zip(long_bodies, asks))
    ]
    for thread in long_threads:
        thread.start()
    for thread in long_threads:  # (each request is bounded by --timeout)
        thread.join(args.timeout + 60)
    stop.set()
    for thread in threads:
        thread.join(args.timeout + 60)
    return Run(system, streams, asks, time.monotonic() - began)


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@contextlib.contextmanager
def serve(system: str, model: str, args: argparse.Namespace, logs: Path) -> Iterator[tuple[str, dict[str, Any], Any]]:
    """A fresh server of `system`, warm: (its URL, what every request of the run carries, whether it is alive)."""
    if system == PEER:
        with mlx_server(model, logs / "mlx_lm.log") as server:
            common = {"temperature": 0.0, "logit_bias": {str(eos_id(model)): -1e4}}
            yield server.url, common, lambda: server.process.poll() is None
        return
    extra = {
        **queue_bounds(1000),
        "ONELANE_MAX_BATCH": str(args.batch),
        "ONELANE_MAX_TOKENS_LIMIT": str(max(4096, args.stream_tokens, args.long_max_tokens)),
        "ONELANE_MAX_PROMPT_CHARS": "400000",
        **({SETTING: "0"} if system == BEFORE else {}),
    }
    with bench_env(model=model) as settings, onelane_stack(settings, quiet=True, **extra) as stack:
        common = {"model": settings.model_name, "temperature": 0.0, "ignore_eos": True}
        for text in PROMPTS[:2]:  # (as mlx_server warms mlx_lm.server)
            warm = post_chat(stack.url, {**common, "messages": _user(text), "max_tokens": 8}, 120)
            if not warm.ok:
                raise RuntimeError(f"warm-up request failed: {warm.error}")
        yield stack.url, common, lambda: stack.alive


def long_prompts(model: str, n: int, tokens: int, max_tokens: int) -> tuple[list[str], list[int | None]]:
    """`n` prompts of about `tokens` tokens each (chat template included), each beginning differently: the texts and
    their token counts by the model's tokenizer (None each if it cannot be loaded here)."""
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
    except Exception as exc:  # noqa: BLE001 - reported; the estimate stands
        print(f"  ! the model's tokenizer did not load ({type(exc).__name__}): prompt lengths are estimates")
        tokenizer = None

    def count(text: str) -> int | None:
        if tokenizer is None:
            return None
        ids = tokenizer.apply_chat_template(_user(text), add_generation_prompt=True, tokenize=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)

    texts, counts = [], []
    for k in range(n):
        head, question = f"Reader {k + 1}: {prompt(k)}.\n", "\nSum it up in one sentence."
        chars = int(tokens * CHARS_PER_TOKEN)
        for _ in range(6):  # (the chars per token of the text so far set the next try)
            text = head + system_message(chars) + question
            got = count(text)
            if got is None or abs(got - tokens) <= max(8, tokens // 200):
                break
            chars = max(1, int(chars * tokens / got))
        texts.append(text)
        counts.append(got)
    context = json.loads((Path(model) / "config.json").read_text()).get("max_position_embeddings")
    longest = max((c for c in counts if c is not None), default=None)
    if context and longest and longest + max_tokens > context:
        raise SystemExit(f"the long prompts ({longest} tokens) and their answers exceed the context ({context})")
    return texts, counts


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def run_lines(r: Run) -> list[str]:
    failed = r.failures()
    kinds = ", ".join(f"{k} {n}" for k, n in failed.most_common()) or "none"
    prompts = sorted({s.prompt_tokens for s in r.longs if s.prompt_tokens is not None})
    chunks = [len(s.arrivals) for s in r.streams if s.ok]
    return [
        f"    window {r.window_s():.2f} s; long requests: TTFT p50 {ms(r.long_ttft(50))} ms, max "
        f"{ms(r.long_ttft(100))} ms, prompt tokens {', '.join(map(str, prompts)) or '-'}",
        f"    stream gaps in the window: p50 {ms(r.gap('window', 50))} ms, p99 {ms(r.gap('window', 99))} ms, max "
        f"{ms(r.gap('window', 100))} ms, each stream's worst p50 {ms(r.worst(50))} ms; overall p50 "
        f"{ms(r.gap('all', 50))} ms, p99 {ms(r.gap('all', 99))} ms, max {ms(r.gap('all', 100))} ms; after the window "
        f"p50 {ms(r.gap('after', 50))} ms",
        f"    {r.through()} of {len(r.streams)} streams decoded through the window, "
        f"{'-' if (n := r.chunks_in_window()) is None else f'{n:.0f}'} chunks each in it (median), "
        f"{min(chunks, default=0)}-{max(chunks, default=0)} chunks each in all; wall {r.wall_s:.1f} s; failed "
        f"{sum(failed.values())} ({kinds})" + ("" if r.alive else "; ! the server had exited by the end"),
    ]


FIGURES: list[tuple[str, Callable[[Run], float | None], float, str]] = [  # label, figure, scale, format
    ("stream gap in window p50 (ms)", lambda r: r.gap("window", 50), 1e3, "{:.0f}"),
    ("stream gap in window p99 (ms)", lambda r: r.gap("window", 99), 1e3, "{:.0f}"),
    ("stream gap in window max (ms)", lambda r: r.gap("window", 100), 1e3, "{:.0f}"),
    ("a stream's worst gap in window p50 (ms)", lambda r: r.worst(50), 1e3, "{:.0f}"),
    ("stream gap overall p50 (ms)", lambda r: r.gap("all", 50), 1e3, "{:.0f}"),
    ("stream gap overall p99 (ms)", lambda r: r.gap("all", 99), 1e3, "{:.0f}"),
    ("stream gap after window p50 (ms)", lambda r: r.gap("after", 50), 1e3, "{:.0f}"),
    ("long prompts' TTFT p50 (ms)", lambda r: r.long_ttft(50), 1e3, "{:.0f}"),
    ("long prompts' TTFT max (ms)", lambda r: r.long_ttft(100), 1e3, "{:.0f}"),
    ("window (s)", Run.window_s, 1.0, "{:.2f}"),
    ("chunks a stream got in window", Run.chunks_in_window, 1.0, "{:.0f}"),
]


def ratio(these: list[Run], those: list[Run], figure: Callable[[Run], float | None]) -> list[float]:
    """Round by round, `figure` of these over that of those (rounds where either has none left out)."""
    return [x / y for p, q in zip(these, those) if (x := figure(p)) is not None and (y := figure(q))]


def summary_lines(results: dict[str, list[Run]]) -> list[str]:
    """Per figure: each system's median (min-max) over the rounds, and the per-round ratios."""
    pairs = ((BEFORE, PEER, "before / mlx"), (AFTER, PEER, "after / mlx"), (AFTER, BEFORE, "after / before"))
    head = "".join(f"{name:>18s}" for name in SYSTEMS) + "".join(f"{label:>16s}" for _, _, label in pairs)
    lines = [f"  {'':40s}{head}"]
    for label, figure, scale, fmt in FIGURES:
        cells = [span([v * scale for r in results[s] if (v := figure(r)) is not None], fmt) for s in SYSTEMS]
        ratios = [span(ratio(results[a], results[b], figure), "{:.2f}x") for a, b, _ in pairs]
        lines.append(f"  {label:40s}" + "".join(f"{c:>18s}" for c in cells) + "".join(f"{c:>16s}" for c in ratios))
    for system in SYSTEMS:
        runs = results[system]
        failed = sum((r.failures() for r in runs), Counter())
        sent = sum(len(r.streams) + len(r.longs) for r in runs)
        kinds = ", ".join(f"{k} {n}" for k, n in failed.most_common()) or "none"
        through = ", ".join(f"{r.through()} of {len(r.streams)}" for r in runs)
        lines.append(
            f"  {system}: failed {sum(failed.values())} of {sent} ({kinds}); streams decoding through the window, "
            f"by round: {through}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_option(parser)
    parser.add_argument("--rounds", type=int, default=1, help="rounds, the systems' order rotating round by round")
    parser.add_argument("--streams", type=int, default=8, help="streams decoding when the long prompts arrive")
    parser.add_argument("--stream-tokens", type=int, default=512, help="each stream's max_tokens (it hangs up sooner)")
    parser.add_argument("--long", type=int, default=4, help="long prompts sent at once")
    parser.add_argument(
        "--long-tokens", type=int, default=6000, help="each long prompt's tokens, chat template included"
    )
    parser.add_argument("--long-max-tokens", type=int, default=8, help="each long prompt's max_tokens")
    parser.add_argument("--tail", type=int, default=16, help="chunks each stream reads after the long requests ended")
    parser.add_argument("--batch", type=int, default=16, help="onelane's ONELANE_MAX_BATCH (at least streams + long)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="a request's longest wait, in seconds")
    args = parser.parse_args()
    counts = (args.rounds, args.streams, args.stream_tokens, args.long, args.long_tokens, args.long_max_tokens)
    if min(counts) < 1 or args.tail < 0 or args.timeout <= 0:
        parser.error("every count must be at least 1 (--tail at least 0)")
    if args.batch < args.streams + args.long:
        parser.error("--batch must hold every stream and every long prompt at once")
    if SETTING not in ENV_NAMES.values():
        print(f"  ! {SETTING} is not a setting of this checkout (tasks/settings.py): both onelane runs are alike")
    logs = Path(tempfile.gettempdir()) / f"onelane-long-prompts-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="onelane-bench-model-") as tmp:
        model = str(model_folder(args.model, Path(tmp)))
        texts, sizes = long_prompts(model, args.long, args.long_tokens, args.long_max_tokens)
        print(
            f"model {args.model}; {args.streams} streams x {args.stream_tokens} tokens, then {args.long} long prompts "
            f"of {', '.join('?' if n is None else str(n) for n in sizes)} tokens (chat template included) x "
            f"{args.long_max_tokens} tokens; onelane ONELANE_MAX_BATCH {args.batch}; {args.rounds} round(s); "
            f"mlx_lm.server's log in {logs}; load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        results: dict[str, list[Run]] = {s: [] for s in SYSTEMS}
        for r in range(args.rounds):
            for system in rotated(list(SYSTEMS), r):
                setting = f"{SETTING}=0" if system == BEFORE else "its default" if system == AFTER else "its defaults"
                print(f"round {r + 1}: {system} ({setting}; load average {os.getloadavg()[0]:.2f})", flush=True)
                with serve(system, model, args, logs) as (url, common, alive):
                    results[system].append(workload(url, common, args, texts, system))
                    results[system][-1].alive = alive()
                print("\n".join(run_lines(results[system][-1])), flush=True)
    print(f"\n{args.rounds} round(s); medians (min-max) over the rounds; ratios round by round:")
    print("\n".join(summary_lines(results)))


if __name__ == "__main__":
    main()
