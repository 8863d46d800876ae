"""Images in the prompt while text streams decode: onelane against mlx-vlm's server (issue 49).

    ./dev.sh bench vision [--arch gemma3|qwen2_5_vl] [--rounds 3] [--image-clients 8] [--text-streams 8]
                          [--text-tokens 200] [--image-tokens 32] [--varied-questions]

No real vision-language checkpoint can be downloaded here, so the model is a random-weight one built bigger than the
tests' (same layout and seed, float32, the demo tokenizer with the architecture's tokens), written once into a
temporary folder; `--arch` picks it (ARCHS):

- `gemma3` (the default): tests/tiny_vision.py's Gemma 3 with GEMMA3_SIZES: text hidden 256, 4 layers, 4 query heads
  and 1 KV head of 64, intermediate 1024, sliding window 512; a SigLIP tower of hidden 128, 2 layers, 224x224 images
  in 14x14 patches pooled to 64 soft tokens an image; 4.8 M parameters;
- `qwen2_5_vl`: tests/vlms/qwen.py's Qwen2.5-VL with QWEN2_5_VL_SIZES: text hidden 256, 4 layers, 4 query heads and
  2 KV heads of 64, intermediate 1024, M-RoPE sections [8, 12, 12] (positions that depend on the image's grid); a
  tower of hidden 128, 4 layers (windowed attention, two full), 14x14 patches merged 2x2; each 320x240 image resized
  to 196x252 (max_pixels 72 * 28 * 28), 63 image tokens; 6.6 M parameters.

Both servers load that folder:

- onelane (`onelane worker` + `onelane web`), a models file naming the folder as its default model, the worker's
  ONELANE_MAX_BATCH (and the queue's bounds) holding every client's job at once;
- mlx-vlm's server (`python -m mlx_vlm.server --model FOLDER`, its continuous batch unbounded), on the same
  /v1/chat/completions, which takes the same data: URLs; it gets OpenBLAS preloaded as onelane's worker does (not
  onelane's shim), as bench/mlx_server.py gives mlx_lm.server.

Each round, each server in turn (their order rotated each round), the same workload:

1. `--text-streams` clients each open a streamed text-only chat (`stream: true`, its own prompt, `--text-tokens`);
2. once every one of them has its first token (decoding is under way), `--image-clients` clients at once each send
   one streamed question about an image of its own: a 320x240 PNG as a base64 data: URL in an OpenAI `image_url`
   part, each a color and a pattern no other request to that server has (so neither server's prefix or vision cache
   answers one; both servers get the same images in a round), `--image-tokens`. The question is the same for all,
   so every image prompt has the same length: mlx-vlm 0.7.10's server fails a batch in which Gemma 3 image prompts
   of different lengths are read together (a concatenate of their (1, 1, L, L) masks), and with it every request in
   its batch, the text streams too; `--varied-questions` asks questions of different lengths, to show it (its
   server reads Qwen2.5-VL image prompts of different lengths together without failing).

Every request is temperature 0 with the model's EOS ids banned (`logit_bias` -100: both servers take it), so every
answer runs to its max_tokens on both. Timestamps are this process's, taken as each content chunk arrives. The image
window of a round: from the first image request sent to the last one's first content chunk (while the image prompts
were being read). Per server and round: the image requests' latency (sent to last chunk) p50 and p90 and their TTFT
(sent to first content chunk) p50; the text streams' completion tokens (their usage) over their span (the first
sent to the last ended), tokens/s; for each text stream its longest gap between two chunks that overlaps the image
window (its worst stall), p50 and max over the streams, beside its longest gap after the window (the image answers
decoding, no prompt being read; p50 over the streams) and the mean time between its tokens (first chunk to last,
median over the streams); how many text streams decoded through the
whole window (if few did, the stall figures say little); the round's wall time; failures by kind. Printed per round
as it goes, then per figure the median and range over rounds for each server and the ratio onelane / mlx-vlm (the
median and range of the per-round ratios; below 1 is onelane's better but for tokens/s), then the failures and any
error lines in the servers' logs. Every figure is measured in this run; every process started is stopped before the
script returns.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import io
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.harness import (
    bench_env,
    free_port,
    matching_lines,
    onelane_stack,
    poll_until,
    queue_bounds,
    rotated,
    spawn,
    tail,
)
from bench.openai_load import StreamTooSlow, contents, sse_payloads
from bench.report import pct, span
from tests.tiny_vision import GEMMA3_EOS, build_gemma3
from tests.vlms.qwen import EOS as QWEN_EOS
from tests.vlms.qwen import build_qwen2_5_vl

GEMMA3_SIZES = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                    intermediate_size=1024, sliding_window=512, vision_image_size=224, vision_patch_size=14,
                    vision_hidden_size=128, vision_intermediate_size=512, vision_num_hidden_layers=2,
                    vision_num_attention_heads=2, mm_tokens_per_image=64)  # fmt: skip
QWEN2_5_VL_SIZES = dict(hidden_size=256, num_hidden_layers=4, intermediate_size=1024, num_attention_heads=4,
                        num_key_value_heads=2, mrope_section=[8, 12, 12], vision_hidden_size=128,
                        vision_intermediate_size=512, vision_depth=4, vision_num_heads=2, vision_window_size=112,
                        vision_fullatt_block_indexes=[1, 3], max_pixels=72 * 28 * 28)  # fmt: skip
WIDTH, HEIGHT = 320, 240
TIMEOUT_S = 600.0  # a request's longest wait: slow on a busy CPU is slow, not failed
FIRST_TOKENS_S = 300.0  # longest wait for every text stream's first token before the images are sent
TOPICS = ["a lighthouse keeper", "the tides", "a night train", "an old library", "a mountain village",
          "a clockmaker", "the first snow", "a river delta"]  # fmt: skip
QUESTION = "What is in this picture?"
VARIED = ["What is in this picture?", "Describe the colors and the pattern, please.", "What shapes?",
          "Describe this image in one sentence, with its colors."]  # fmt: skip


@dataclass(frozen=True)
class Arch:
    """A benchmark model: what builds its folder (with `sizes`), its EOS ids (banned), and how the summary names it."""

    build: Callable[..., Path]
    sizes: dict[str, Any]
    eos: list[int]
    about: str


#: what `--arch` takes
ARCHS = {
    "gemma3": Arch(build_gemma3, GEMMA3_SIZES, list(GEMMA3_EOS), "Gemma 3 of tests/tiny_vision.py"),
    "qwen2_5_vl": Arch(build_qwen2_5_vl, QWEN2_5_VL_SIZES, [QWEN_EOS], "Qwen2.5-VL of tests/vlms/qwen.py"),
}


def image_url(n: int) -> str:
    """The n-th image: a 320x240 PNG with its own two colors and one of four patterns (solid with a disc, stripes,
    checks, rings), as a data: URL."""
    from PIL import Image, ImageDraw

    def color(k: int) -> tuple[int, int, int]:
        return ((k * 97 + 31) % 256, (k * 57 + 101) % 256, (k * 151 + 7) % 256)

    back, fore, step = color(2 * n), color(2 * n + 1), 8 + (n * 5) % 24
    image = Image.new("RGB", (WIDTH, HEIGHT), back)
    draw = ImageDraw.Draw(image)
    pattern = n % 4
    if pattern == 0:
        r = 30 + (n * 13) % 80
        draw.ellipse((WIDTH // 2 - r, HEIGHT // 2 - r, WIDTH // 2 + r, HEIGHT // 2 + r), fill=fore)
    elif pattern == 1:
        for x in range(0, WIDTH, 2 * step):
            draw.rectangle((x, 0, x + step - 1, HEIGHT), fill=fore)
    elif pattern == 2:
        for y in range(0, HEIGHT, step):
            for x in range((y // step) % 2 * step, WIDTH, 2 * step):
                draw.rectangle((x, y, x + step - 1, y + step - 1), fill=fore)
    else:
        for r in range(max(WIDTH, HEIGHT), 0, -2 * step):
            draw.ellipse((WIDTH // 2 - r, HEIGHT // 2 - r, WIDTH // 2 + r, HEIGHT // 2 + r), fill=fore)
            if r > step:  # (the ring's inside, when it has one)
                draw.ellipse((WIDTH // 2 - r + step, HEIGHT // 2 - r + step, WIDTH // 2 + r - step, HEIGHT // 2 + r - step),
                             fill=back)  # fmt: skip
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def text_request(c: int, round_no: int, max_tokens: int) -> list[dict[str, Any]]:
    """Text stream `c`'s messages in round `round_no` (its own, so no cache answers it from another's)."""
    topic = TOPICS[c % len(TOPICS)]
    prompt = f"Reader {c + 1}, round {round_no + 1}: write a long story about {topic}, at least {max_tokens} words."
    return [{"role": "user", "content": prompt}]


def image_request(n: int, c: int, varied: bool = False) -> list[dict[str, Any]]:
    """Image client `c`'s messages: the n-th image and QUESTION (`varied`: one of VARIED, of other lengths)."""
    question = VARIED[c % len(VARIED)] if varied else QUESTION
    parts = [{"type": "image_url", "image_url": {"url": image_url(n)}}, {"type": "text", "text": question}]
    return [{"role": "user", "content": parts}]


@dataclass
class Stream:
    """One streamed request as it went: when it was sent and ended, each content chunk's arrival (all
    time.perf_counter()), the completion tokens its usage reported (else its chunks), and its failure."""

    sent: float
    arrivals: list[float] = field(default_factory=list)
    ended: float = 0.0
    tokens: int = 0
    error: str | None = None
    first: threading.Event = field(default_factory=threading.Event)  # set at its first chunk or its end

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        return self.arrivals[0] - self.sent if self.arrivals else None


def stream_chat(url: str, request: dict[str, Any], stream: Stream) -> None:
    """POST a streamed chat completion and record its chunks into `stream` as they arrive; never raises."""
    parts = urlsplit(url)
    body = json.dumps({**request, "stream": True, "stream_options": {"include_usage": True}}).encode()
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=TIMEOUT_S)
    stream.sent, done, usage = time.perf_counter(), False, None
    try:
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            stream.error = f"http {response.status}"
            return
        for payload in sse_payloads(response, time.monotonic() + TIMEOUT_S):
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
                stream.arrivals.append(time.perf_counter())
                stream.first.set()
        if not done and stream.error is None:
            stream.error = "ended without [DONE]"
    except StreamTooSlow:
        stream.error = "timeout"
    except (OSError, http.client.HTTPException, ValueError) as exc:
        stream.error = type(exc).__name__
    finally:
        conn.close()
        stream.ended = time.perf_counter()
        stream.tokens = int((usage or {}).get("completion_tokens", len(stream.arrivals)))
        stream.first.set()


@dataclass
class Round:
    """One server's round: its text streams, its image requests and the wall time."""

    text: list[Stream]
    images: list[Stream]
    wall_s: float

    @property
    def window(self) -> tuple[float, float]:
        """From the first image request sent to the last one's first chunk (its end, if it failed before one)."""
        return min(s.sent for s in self.images), max(s.arrivals[0] if s.arrivals else s.ended for s in self.images)

    def stalls(self) -> list[float]:
        """Each ok text stream's longest gap between two chunks that overlaps the image window."""
        w0, w1 = self.window
        out = []
        for s in self.text:
            gaps = [b - a for a, b in zip(s.arrivals, s.arrivals[1:]) if b > w0 and a < w1]
            if s.ok and gaps:
                out.append(max(gaps))
        return out

    def calm(self, q: float) -> float | None:
        """Each ok text stream's longest gap between two chunks after the image window (the image answers decoding
        in the batch, no prompt read), its q-th percentile over the streams."""
        w1 = self.window[1]
        worst = []
        for s in self.text:
            gaps = [b - a for a, b in zip(s.arrivals, s.arrivals[1:]) if a >= w1]
            if s.ok and gaps:
                worst.append(max(gaps))
        return pct(worst, q) if worst else None

    def interval(self) -> float | None:
        """The median over ok text streams of their mean time between tokens (first chunk to last, over tokens)."""
        means = [(s.arrivals[-1] - s.arrivals[0]) / (s.tokens - 1) for s in self.text if s.ok and s.tokens > 1]
        return statistics.median(means) if means else None

    def through(self) -> int:
        """Text streams that decoded through the whole image window (a chunk before it and one after)."""
        w0, w1 = self.window
        return sum(1 for s in self.text if s.arrivals and s.arrivals[0] <= w0 and s.arrivals[-1] >= w1)

    def text_tps(self) -> float | None:
        ok = [s for s in self.text if s.ok]
        if not ok:
            return None
        return sum(s.tokens for s in ok) / (max(s.ended for s in ok) - min(s.sent for s in ok))

    def image_latency(self, q: float) -> float | None:
        done = [s.ended - s.sent for s in self.images if s.ok]
        return pct(done, q) if done else None

    def image_ttft(self, q: float) -> float | None:
        ttfts = [t for s in self.images if s.ok and (t := s.ttft) is not None]
        return pct(ttfts, q) if ttfts else None

    def stall(self, q: float) -> float | None:
        stalls = self.stalls()
        return pct(stalls, q) if stalls else None

    def failures(self) -> Counter[str]:
        return Counter(f"{kind} {s.error}" for kind, group in (("text", self.text), ("image", self.images))
                       for s in group if not s.ok)  # fmt: skip


def workload(url: str, model: str, round_no: int, args: argparse.Namespace, first_image: int, eos: list[int]) -> Round:
    """The text streams, then (once each has its first token) the image requests, all at once; every request
    temperature 0 with the `eos` ids banned. Images `first_image` on."""
    common = {"model": model, "temperature": 0.0, "logit_bias": {str(t): -100 for t in eos}}
    texts = [Stream(0.0) for _ in range(args.text_streams)]
    images = [Stream(0.0) for _ in range(args.image_clients)]
    bodies = [{**common, "messages": text_request(c, round_no, args.text_tokens), "max_tokens": args.text_tokens}
              for c in range(args.text_streams)]  # fmt: skip
    asks = [{**common, "messages": image_request(first_image + c, c, args.varied_questions),
             "max_tokens": args.image_tokens} for c in range(args.image_clients)]  # fmt: skip
    threads = [threading.Thread(target=stream_chat, args=(url, b, s)) for b, s in zip(bodies, texts)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + FIRST_TOKENS_S
    for s in texts:
        s.first.wait(max(0.0, deadline - time.monotonic()))
    go = threading.Barrier(args.image_clients)

    def ask(body: dict[str, Any], s: Stream) -> None:
        go.wait()
        stream_chat(url, body, s)

    image_threads = [threading.Thread(target=ask, args=(b, s)) for b, s in zip(asks, images)]
    for thread in image_threads:
        thread.start()
    for thread in threads + image_threads:
        thread.join()
    return Round(texts, images, time.perf_counter() - began)


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f}"


def round_line(r: Round) -> str:
    stalls, tps = r.stalls(), r.text_tps()
    failed = ", ".join(f"{k} {n}" for k, n in r.failures().most_common()) or "none"
    image_tokens = [s.tokens for s in r.images if s.ok]
    text_tokens = [s.tokens for s in r.text if s.ok]
    return (
        f"    images: latency p50 {ms(r.image_latency(50))} ms, p90 {ms(r.image_latency(90))} ms, TTFT p50 "
        f"{ms(r.image_ttft(50))} ms (tokens/answer {_median(image_tokens)}); text: "
        f"{'-' if tps is None else f'{tps:.1f}'} tok/s (tokens/stream {_median(text_tokens)}), worst gap in the image "
        f"window ({ms(r.window[1] - r.window[0])} ms) p50 {ms(r.stall(50))} ms, max "
        f"{ms(max(stalls) if stalls else None)} ms (after it p50 {ms(r.calm(50))} ms; mean time between tokens "
        f"{ms(r.interval())} ms), {r.through()} of {len(r.text)} streams decoded through it; wall {r.wall_s:.2f} s; "
        f"failed {failed}"
    )


def _median(values: list[int]) -> str:
    return f"{statistics.median(values):.0f}" if values else "-"


FIGURES: list[tuple[str, Callable[[Round], float | None], float, str]] = [  # label, figure, scale, format
    ("image latency p50 (ms)", lambda r: r.image_latency(50), 1e3, "{:.0f}"),
    ("image latency p90 (ms)", lambda r: r.image_latency(90), 1e3, "{:.0f}"),
    ("image TTFT p50 (ms)", lambda r: r.image_ttft(50), 1e3, "{:.0f}"),
    ("text streams tok/s", Round.text_tps, 1.0, "{:.1f}"),
    ("text worst gap in window p50 (ms)", lambda r: r.stall(50), 1e3, "{:.0f}"),
    ("text worst gap in window max (ms)", lambda r: max(r.stalls(), default=None), 1e3, "{:.0f}"),
    ("text worst gap after window p50 (ms)", lambda r: r.calm(50), 1e3, "{:.0f}"),
    ("text mean time between tokens (ms)", Round.interval, 1e3, "{:.1f}"),
    ("wall (s)", lambda r: r.wall_s, 1.0, "{:.2f}"),
]


def summary_lines(onelane: list[Round], peer: list[Round]) -> list[str]:
    """Per figure: each server's median (range) over the rounds, and the per-round ratios onelane / mlx-vlm."""
    lines = [f"  {'':40s} {'onelane':>18s} {'mlx-vlm server':>18s} {'onelane / mlx-vlm':>18s}"]
    for label, figure, scale, fmt in FIGURES:
        a = [v * scale for r in onelane if (v := figure(r)) is not None]
        b = [v * scale for r in peer if (v := figure(r)) is not None]
        ratios = [x / y for p, q in zip(onelane, peer) if (x := figure(p)) is not None and (y := figure(q))]
        lines.append(f"  {label:40s} {span(a, fmt):>18s} {span(b, fmt):>18s} {span(ratios, '{:.2f}x'):>18s}")
    for name, rounds in (("onelane", onelane), ("mlx-vlm server", peer)):
        failed = sum((r.failures() for r in rounds), Counter())
        sent = sum(len(r.text) + len(r.images) for r in rounds)
        through = ", ".join(f"{r.through()} of {len(r.text)}" for r in rounds)
        kinds = ", ".join(f"{k} {n}" for k, n in failed.most_common()) or "none"
        lines.append(f"  {name}: failed {sum(failed.values())} of {sent} ({kinds}); text streams decoding through "
                     f"the image window, by round: {through}")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=sorted(ARCHS), default="gemma3", help="the model's architecture")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--image-clients", type=int, default=8)
    parser.add_argument("--text-streams", type=int, default=8)
    parser.add_argument("--text-tokens", type=int, default=200, help="each text stream's max_tokens")
    parser.add_argument("--image-tokens", type=int, default=32, help="each image request's max_tokens")
    parser.add_argument("--varied-questions", action="store_true", help="image questions of different lengths")
    args = parser.parse_args()
    if min(args.rounds, args.image_clients, args.text_streams, args.text_tokens, args.image_tokens) < 1:
        parser.error("every count must be at least 1")
    from worker.blas import worker_env

    arch = ARCHS[args.arch]
    jobs = args.image_clients + args.text_streams
    with tempfile.TemporaryDirectory(prefix="onelane-bench-vision-") as tmp:
        folder = arch.build(Path(tmp) / args.arch, **arch.sizes)
        models = Path(tmp) / "models.toml"
        models.write_text(f'[models.{args.arch}]\npath = "{folder}"\ndefault = true\n')
        with bench_env() as settings:  # (its model is not served: the models file names the one served)
            port = free_port()
            vlm_log = Path(tmp) / "mlx_vlm.log"
            vlm_args = [sys.executable, "-m", "mlx_vlm.server", "--host", "127.0.0.1", "--port", str(port),
                        "--model", str(folder), "--log-level", "WARNING"]  # fmt: skip
            vlm_env = worker_env({k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}, shim=False)
            onelane_extra = dict(ONELANE_MODEL="", ONELANE_MODELS_FILE=str(models), ONELANE_MAX_BATCH=str(jobs),
                                 **queue_bounds(max(jobs, 32)))  # fmt: skip
            with (
                onelane_stack(settings, quiet=True, **onelane_extra) as stack,
                spawn(vlm_args, vlm_log, vlm_env) as vlm,
            ):
                vlm_url = f"http://127.0.0.1:{port}"
                if not poll_until(lambda: _answers(vlm_url, str(folder)), 180):
                    raise RuntimeError(f"mlx-vlm's server did not answer:\n{tail(vlm_log)}")
                servers = {"onelane": (stack.url, args.arch), "mlx-vlm server": (vlm_url, str(folder))}
                for n, (url, name) in enumerate(servers.values()):  # each reads a text and an image before the clock
                    warm = [Stream(0.0), Stream(0.0)]
                    stream_chat(url, {"model": name, "messages": text_request(0, -1, 8), "max_tokens": 8}, warm[0])
                    ask = {"model": name, "messages": image_request(-1 - n, 0), "max_tokens": 8}
                    stream_chat(url, ask, warm[1])
                    if not all(s.ok for s in warm):
                        raise RuntimeError(f"warm-up failed on {url}: {[s.error for s in warm]}")
                results: dict[str, list[Round]] = {name: [] for name in servers}
                for r in range(args.rounds):
                    for name in rotated(list(servers), r):
                        print(f"round {r + 1}: {name} (load average {os.getloadavg()[0]:.2f})", flush=True)
                        results[name].append(workload(*servers[name], r, args, r * args.image_clients, arch.eos))
                        print(round_line(results[name][-1]), flush=True)
                alive = {"onelane": stack.alive, "mlx-vlm server": vlm.poll() is None}
            logged = {
                "onelane worker": matching_lines(Path(settings.var_dir) / "worker.log", ("Traceback", " ERROR ")),
                "onelane web": matching_lines(Path(settings.var_dir) / "web.log", ("Traceback", " ERROR ")),
                "mlx-vlm server": matching_lines(vlm_log, ("Traceback", " ERROR ")),
            }
    print(
        f"\n{args.rounds} round(s): {args.text_streams} text streams ({args.text_tokens} tokens each), then "
        f"{args.image_clients} image requests ({WIDTH}x{HEIGHT} PNG, {args.image_tokens} tokens each, "
        f"{'questions of varied lengths' if args.varied_questions else 'one question'}), all streamed, "
        f"temperature 0, EOS banned; model: {arch.about}, sizes {arch.sizes}, float32"
    )
    print("\n".join(summary_lines(results["onelane"], results["mlx-vlm server"])))
    for name, up in alive.items():
        if not up:
            print(f"  ! {name} had exited by the end (see its log)")
    for name, lines in logged.items():
        if lines:
            print(f"  ! {name}'s log: {len(lines)} error lines, the first: {lines[0][:200]}")


def _answers(url: str, model: str) -> bool:
    s = Stream(0.0)
    stream_chat(url, {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}, s)
    return s.ok


if __name__ == "__main__":
    main()
