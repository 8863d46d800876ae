"""Qwen2.5-VL through the whole stack (issue 61): a tiny Qwen2.5-VL (tests/vlms/qwen.py: M-RoPE, its positions
depend on its images) served by the real worker beside a text model, asked through the openai SDK. Two images in
one message, streamed, and three clients asking about images of other sizes at once (other grids, other rope
deltas: each row carries its own positions, worker/batch/positions.py), each answered as `mlx_vlm.generate` answers
that prompt alone; a follow-up about the same image reads its prefix from the cache and no pixels; a streamed answer
cancelled; and a worker process killed mid-answer, whose job the next worker finishes from the tokens delivered, at
the positions the image gives them (tests/vision_stories.py). On main before issue 61 the model was refused at
load, and every request about it failed.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tasks.settings import Settings
from tests.test_hostile_models import serve
from tests.vision_stories import Reference, cancel_story, image_part, kill_story, png
from tests.vlms.qwen import ARCHS

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow_file]

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen") / "qwen2_5_vl"
    ARCHS["qwen2_5_vl"](path)
    return path


@pytest.fixture
def settings(settings: Settings, folder: Path, demo_model: Path, tmp_path: Path) -> Settings:
    tables = {"chat": {"path": str(demo_model), "default": True}, "qwen": {"path": str(folder)}}
    return serve(settings.model_copy(update={"max_batch": 4, "prefill_step": 16}), tmp_path, **tables)[0]


@pytest.fixture(scope="module")
def mlx_vlm_alone(folder: Path) -> Reference:
    return Reference(folder)


@pytest.fixture
def reference(mlx_vlm_alone: Reference) -> Any:
    """mlx-vlm's own greedy answer (that prompt alone), written as onelane writes tokens (mlx-lm's detokenizer)."""
    return lambda turns, images: mlx_vlm_alone.text(turns, images, MAX_TOKENS)


def test_qwen_answers_about_two_images_in_a_stream_and_three_clients_at_once(
    start_worker, settings, live_server, reference
):
    from openai import OpenAI

    worker = start_worker(settings)
    client = OpenAI(base_url=f"{live_server}/v1", api_key="unused", max_retries=0)

    # Given two images in one message, asked for as a stream
    red, blue = png("red", (56, 56)), png("blue", (112, 84))
    content = [image_part(red), image_part(blue), {"type": "text", "text": "Which is bigger?"}]
    stream = client.chat.completions.create(
        model="qwen",
        messages=[{"role": "user", "content": content}],  # type: ignore[misc, list-item]
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    # Then it is the model's own answer about both
    both = [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Which is bigger?"}]
    assert streamed == reference([{"role": "user", "content": both}], [red, blue])

    # When three clients ask about images of three sizes at once
    images = {"green": png("green", (112, 112)), "teal": png("teal", (56, 112)), "navy": png("navy", (84, 84))}
    answers: dict[str, str | None] = {}

    def ask(colour: str) -> None:
        reply = client.chat.completions.create(
            model="qwen",
            messages=[{"role": "user", "content": [image_part(images[colour]), {"type": "text", "text": "What?"}]}],
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
        answers[colour] = reply.choices[0].message.content

    threads = [threading.Thread(target=ask, args=(c,)) for c in images]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Then each is the model's own answer about its image, alone
    one = [{"type": "image"}, {"type": "text", "text": "What?"}]
    assert answers == {c: reference([{"role": "user", "content": one}], [data]) for c, data in images.items()}

    # And a follow-up about the first image reads its prefix from the cache, no pixels, and is the model's answer
    engine = worker.models.get_quietly("qwen")
    read = engine.images_read
    said = answers["green"]
    turns: list[dict[str, Any]] = [
        {"role": "user", "content": [image_part(images["green"]), {"type": "text", "text": "What?"}]},
        {"role": "assistant", "content": said},
        {"role": "user", "content": "And then?"},
    ]
    follow = client.chat.completions.create(
        model="qwen",
        messages=turns,  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert engine.images_read == read
    assert follow.usage is not None and follow.usage.prompt_tokens_details is not None
    assert (follow.usage.prompt_tokens_details.cached_tokens or 0) > 0
    hub = [
        {"role": "user", "content": one},
        {"role": "assistant", "content": said},
        {"role": "user", "content": "And then?"},
    ]
    assert follow.choices[0].message.content == reference(hub, [images["green"]])


def test_a_streamed_answer_about_an_image_is_cancelled_and_the_next_is_the_models(
    start_worker, settings, live_server, store, mlx_vlm_alone
):
    start_worker(settings)
    cancel_story(live_server, store, "qwen", mlx_vlm_alone, png("orange", (84, 56)), png("purple", (56, 84)))


def test_a_worker_killed_mid_answer_about_an_image_resumes_it_with_the_models_positions(
    settings, tmp_path, worker_process, store, mlx_vlm_alone
):
    # (the image's grid shifts every later position by its rope delta: the resumed run must read it again)
    kill_story(settings, tmp_path, worker_process, store, "qwen", mlx_vlm_alone, png("olive", (112, 56)))


def test_a_qwen3_vl_worker_killed_mid_answer_resumes_it_with_its_deepstack_features(
    settings, tmp_path, worker_process, store, tmp_path_factory
):
    # (Qwen3-VL adds its image's deepstack features to its first layers' states at the image's tokens, beside M-RoPE:
    # the resumed run reads them again with the image, worker/vision_beside.py)
    folder = tmp_path_factory.mktemp("qwen3") / "qwen3_vl"
    ARCHS["qwen3_vl"](folder)
    kill_story(settings, tmp_path, worker_process, store, "qwen3", Reference(folder), png("olive", (56, 112)))
