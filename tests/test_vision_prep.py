"""Image work beside a stream (issue 60, item 3): a prompt's images are decoded and prepared by the image preparer
(worker/vision_prep.py, a child process), not on the device thread, and the vision tower reads them one image a step
(worker/vision_tower.py), so another user's stream keeps the decode floor (ONELANE_DECODE_FLOOR: a token every
250 ms, and a margin for a loaded machine) through a chat about 32 images, their count_tokens and a follow-up; and
a follow-up reads no pixels.

The model is the tiny Gemma 3 with a bigger tower (448x448 images in 32x32 patches, as tests/tiny_vision.py builds
it for a benchmark), 32 images a prompt: on the device thread, their preparation and one pass over them held a stream
1.1-10 s on this machine. A gap is measured against the same stream's worst gap in a window as long right after (a
loaded machine stalls every thread now and then), the median of three tries. A request of many images is also
charged for them as it is admitted (fair order).
"""

from __future__ import annotations

import base64
import io
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from PIL import Image

from tasks.settings import Settings
from tests.helpers import openai_chunks
from tests.test_hostile_models import serve
from tests.tiny_vision import build_gemma3

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow_file]

IMAGES = 32
SIZE = 448  # the tower's (the door keeps an image up to twice it as sent)
FLOOR_S = 0.25  # ONELANE_DECODE_FLOOR's default, 4 tokens/s
MARGIN_S = 0.5  # a loaded machine's scheduling beside it (the web runs in the worker's process here, as do the
# stories' clients); before the change each story's median was 2.4-4.4 s, no try below 1.1 s (docs/performance.md).
# One image's pass through the tower is a step the floor cannot split: beside two busy processes the chat story's
# medians were 0.33 s (twice, tries 0.16-0.58 s), and 0.53 s in a full suite's run beside them (2026-12-06)
TRIES = 3
QUIET_S = 10.0  # the quiet window's length, at most (the work's: a shorter one would see less of the noise)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # (a sliding window longer than the prompts: its caches trim, so a follow-up's prefix is read from the cache)
    sizes = dict(vision_image_size=SIZE, vision_patch_size=32, mm_tokens_per_image=4, sliding_window=1024)
    return build_gemma3(tmp_path_factory.mktemp("bigger") / "gemma", **sizes)


@pytest.fixture
def settings(settings: Settings, folder: Path, tmp_path: Path) -> Settings:
    update = {"max_batch": 4, "max_images": IMAGES, "max_tokens_limit": 30_000, "kv_budget_tokens": 1_000_000}
    return serve(settings.model_copy(update=update), tmp_path, gemma={"path": str(folder)})[0]


@pytest.fixture
def worker(settings: Settings, start_worker):  # type: ignore[no-untyped-def]
    return start_worker(settings)


def photos(seed: int) -> list[str]:
    """IMAGES noisy JPEGs twice the tower's size (none alike: no cache answers them), base64."""
    draw = np.random.default_rng(seed)
    out = []
    for _ in range(IMAGES):
        data = io.BytesIO()
        pixels = draw.integers(0, 256, (2 * SIZE, 2 * SIZE, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(data, "JPEG", quality=50)
        out.append(base64.b64encode(data.getvalue()).decode())
    return out


def openai_turn(images: list[str], text: str = "What are these?") -> dict[str, Any]:
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{b}"}} for b in images
    ]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


class Stream:
    """A long text answer on the model, its tokens' arrival times as they come."""

    def __init__(self, server: str) -> None:
        body = {
            "model": "gemma",
            "prompt": "once upon a time",
            "max_tokens": 30_000,
            "ignore_eos": True,
            "stream": True,
        }
        self.response = requests.post(f"{server}/v1/completions", json=body, stream=True, timeout=600)
        self.times: list[float] = []  # (read on another thread: a copy is taken to read them)
        self.first = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        assert self.first.wait(120)

    def _read(self) -> None:
        try:
            for _ in openai_chunks(self.response):
                self.times.append(time.monotonic())
                self.first.set()
        except (requests.RequestException, AttributeError):  # (closed by the story: it ends)
            pass

    def worst_gap(self, start: float, end: float) -> float:
        """The longest wait for a token that overlaps [start, end]."""
        times = list(self.times)
        gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b >= start and a <= end]
        return max(gaps, default=end - start)

    def close(self) -> None:
        self.response.close()


@contextmanager
def streaming(server: str) -> Iterator[Stream]:
    stream = Stream(server)
    try:
        yield stream
    finally:
        stream.close()


def stall(server: str, work: Callable[[], None]) -> float:
    """How much longer a stream's worst gap is while `work` runs than in a window as long just after it (QUIET_S at
    most), the stream on its own again."""
    with streaming(server) as stream:
        before = time.monotonic()
        work()
        after = time.monotonic()
        window = min(after - before, QUIET_S)
        deadline = time.monotonic() + 120
        while not stream.times or stream.times[-1] <= after + 0.3 + window:  # (a token past the quiet window: on a
            assert stream.thread.is_alive(), "the stream ended before the story did"  # loaded machine, late)
            assert time.monotonic() < deadline, "the stream stalled past the story"
            time.sleep(0.05)
        worst = stream.worst_gap(before, after)
        quiet = stream.worst_gap(after + 0.3, after + 0.3 + window)
    print(f"worst {worst:.3f} quiet {quiet:.3f} took {after - before:.2f}")
    return worst - quiet


def chat(server: str, messages: list[dict[str, Any]]) -> str:
    body = {"model": "gemma", "messages": messages, "max_tokens": 2, "temperature": 0}
    reply = requests.post(f"{server}/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


def count(server: str, images: list[str]) -> int:
    blocks = [{"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": b}} for b in images]
    body = {"model": "gemma", "messages": [{"role": "user", "content": [*blocks, {"type": "text", "text": "hi"}]}]}
    reply = requests.post(f"{server}/v1/messages/count_tokens", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    return int(reply.json()["input_tokens"])


def test_a_stream_keeps_the_floor_beside_a_chat_about_32_images(worker, live_server):
    # (the image readers and the preparer started, and a first prompt of 32 images read: in the first quiet run of a
    # fresh machine, its files not yet in memory, the first two tries stalled the stream 0.55 and 1.14 s, the third
    # 0.02 s; a warm machine's tries are 0.05-0.15 s, beside a busy process too)
    chat(live_server, [openai_turn(photos(99))])
    stalls = [stall(live_server, lambda s=s: chat(live_server, [openai_turn(photos(s))])) for s in range(TRIES)]
    print("chat stalls", stalls)
    assert statistics.median(stalls) < FLOOR_S + MARGIN_S, stalls


def test_a_stream_keeps_the_floor_beside_count_tokens_of_32_images(worker, live_server):
    counted: list[int] = []
    count(live_server, photos(99))  # (the image readers and the preparer started, and 32 images read: as above)
    stalls = [stall(live_server, lambda s=s: counted.append(count(live_server, photos(100 + s)))) for s in range(TRIES)]
    print("count_tokens stalls", stalls)
    assert statistics.median(stalls) < FLOOR_S + MARGIN_S, stalls
    assert all(n > IMAGES * 4 for n in counted)  # each image's tokens counted


def test_a_follow_up_reads_no_pixels_and_keeps_the_floor(worker, live_server):
    engine = lambda: worker.models.get_quietly("gemma")  # noqa: E731
    stalls = []
    for s in range(TRIES):
        first = [openai_turn(photos(200 + s))]
        said = chat(live_server, first)
        before = (engine().prep.asked, engine().images_read)
        turns = [*first, {"role": "assistant", "content": said}, {"role": "user", "content": "And then?"}]
        stalls.append(stall(live_server, lambda t=turns: chat(live_server, t)))  # type: ignore[misc]
        # no image was decoded or prepared again, nor read by the tower: the prefix cache held them
        assert (engine().prep.asked, engine().images_read) == before
    print("follow-up stalls", stalls)
    assert statistics.median(stalls) < FLOOR_S + MARGIN_S, stalls


def test_a_request_of_many_images_is_charged_for_them_as_it_is_admitted(settings, live_server, store):
    from tasks import keys

    # Given no worker: each request waits where admission placed it, charged its estimate
    def admitted(images: list[str]) -> int:
        parts = [{"type": "input_image", "image_url": f"data:image/jpeg;base64,{b}"} for b in images]
        content = [*parts, {"type": "input_text", "text": "What are these?"}]
        body = {"model": "gemma", "input": [{"role": "user", "content": content}], "max_output_tokens": 4}
        reply = requests.post(f"{live_server}/v1/responses", json=body | {"background": True}, timeout=60)
        assert reply.status_code == 200, reply.text
        return int(store.redis.hget(keys.job("job_" + reply.json()["id"].removeprefix("resp_")), "cost"))

    # When one asks about 8 images, another the same words alone
    with_images, words = admitted(photos(300)[:8]), admitted([])

    # Then the images are charged as about the tokens they become, at once
    assert with_images - words >= 8 * 200  # (their 256 tokens each, as the estimate of a prompt rounds them)
