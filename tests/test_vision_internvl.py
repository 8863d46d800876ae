"""InternVL through the whole stack (issue 61): a tiny InternVL (tests/vlms/internvl.py: an image tiled by its aspect
ratio, its prompt rendered with its processor's own template, `User: … Assistant:`, as mlx-vlm renders it) served by
the real worker beside a text model, asked through the openai SDK: two images in one message, streamed; a follow-up
about an image that reads its prefix from the cache and no pixels; a streamed answer cancelled; and a worker process
killed mid-answer whose job the next worker finishes. Every answer is `mlx_vlm.generate`'s for that chat alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tasks.settings import Settings
from tests.test_hostile_models import serve
from tests.vision_stories import Reference, asked, cancel_story, hub, kill_story, png
from tests.vlms.internvl import build_internvl_chat

pytestmark = pytest.mark.timeout(300)

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("internvl") / "internvl_chat"
    build_internvl_chat(path)
    return path


@pytest.fixture
def settings(settings: Settings, folder: Path, demo_model: Path, tmp_path: Path) -> Settings:
    tables = {"chat": {"path": str(demo_model), "default": True}, "internvl": {"path": str(folder)}}
    return serve(settings.model_copy(update={"max_batch": 4, "prefill_step": 16}), tmp_path, **tables)[0]


@pytest.fixture(scope="module")
def reference(folder: Path) -> Reference:
    return Reference(folder)


def test_internvl_answers_about_two_images_in_a_stream_and_a_follow_up_reads_no_pixels(
    start_worker, settings, live_server, reference
):
    from openai import OpenAI

    worker = start_worker(settings)
    client = OpenAI(base_url=f"{live_server}/v1", api_key="unused", max_retries=0)

    # Given two images in one message (a square one: one tile; a wide one: two tiles and a thumbnail), streamed
    square, wide = png("red", (56, 56)), png("blue", (112, 56))
    stream = client.chat.completions.create(
        model="internvl",
        messages=asked([square, wide], "Which is wider?"),  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    # Then it is the model's own answer about both
    assert streamed == reference.text([hub(2, "Which is wider?")], [square, wide], MAX_TOKENS)

    # When a client asks about one image, then follows up on the model's answer
    engine = worker.models.get_quietly("internvl")
    first = client.chat.completions.create(
        model="internvl",
        messages=asked([wide], "What?"),  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    said = first.choices[0].message.content
    assert said == reference.text([hub(1, "What?")], [wide], MAX_TOKENS)
    read = engine.images_read
    turns: list[dict[str, Any]] = [
        *asked([wide], "What?"),
        {"role": "assistant", "content": said},
        {"role": "user", "content": "And then?"},
    ]
    follow = client.chat.completions.create(
        model="internvl",
        messages=turns,  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    # Then the image's prefix came from the cache (no pixels read), and the answer is the model's
    assert engine.images_read == read
    assert follow.usage is not None and follow.usage.prompt_tokens_details is not None
    assert (follow.usage.prompt_tokens_details.cached_tokens or 0) > 12  # (past the image's 12 tokens)
    # (mlx-vlm renders InternVL's earlier answer as an empty `Assistant: ` turn: its processor's template reads a
    # turn's text from content parts, and mlx-vlm passes an assistant's content on as a string; onelane renders as
    # mlx-vlm does: the follow-up's prompt holds the image and both questions, not the answer between them)
    chat = [hub(1, "What?"), {"role": "assistant", "content": said}, {"role": "user", "content": "And then?"}]
    assert follow.choices[0].message.content == reference.text(chat, [wide], MAX_TOKENS)


def test_a_streamed_answer_about_an_image_is_cancelled_and_the_next_is_the_models(
    start_worker, settings, live_server, store, reference
):
    start_worker(settings)
    cancel_story(live_server, store, "internvl", reference, png("orange", (112, 56)), png("purple", (56, 56)))


def test_a_worker_killed_mid_answer_about_an_image_resumes_it(settings, tmp_path, worker_process, store, reference):
    kill_story(settings, tmp_path, worker_process, store, "internvl", reference, png("olive", (56, 112)))
