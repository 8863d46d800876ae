"""Newly served vision families through the whole stack (issue 61): LLaVA-NeXT (its embeddings outnumber its
prompt's ids) and Llama 3.2 Vision (its image jobs run alone), served from one models file by the real worker, asked
through the official openai client: each answer mlx-vlm's own; a stream; a cancel of an image job running alone,
after which the lane goes on; and the models' records saying how their image prompts run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import requests

from tasks.job import JobStatus
from tasks.settings import Settings
from tests.helpers import openai_chunks
from tests.test_hostile_models import serve
from tests.test_vision import data_url
from tests.vision_batch import ASKS, Ask
from tests.vlms.llava import build_llava_next
from tests.vlms.mllama import build_mllama

pytestmark = pytest.mark.timeout(300)

MODELS = {"llava": build_llava_next, "llama-vision": build_mllama}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("alone-stack")
    for name, build in MODELS.items():
        build(root / name)
    return {name: root / name for name in MODELS}


@pytest.fixture
def settings(settings: Settings, folders: dict[str, Path], demo_model: Path, tmp_path: Path) -> Settings:
    tables = {"chat": {"path": str(demo_model), "default": True}}
    tables |= {name: {"path": str(folder)} for name, folder in folders.items()}
    return serve(settings.model_copy(update={"max_batch": 4, "prefill_step": 16}), tmp_path, **tables)[0]


@pytest.fixture
def worker(settings: Settings, start_worker):  # type: ignore[no-untyped-def]
    return start_worker(settings)


@pytest.fixture(scope="module")
def reference(folders: dict[str, Path]) -> Any:
    """mlx-vlm's own greedy answer (its eos ignored, as the requests ask), written as onelane writes tokens (mlx-lm's
    streaming detokenizer)."""
    import mlx_vlm
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from tests.vision_batch import reference as tokens

    loaded = {name: mlx_vlm.load(str(folder)) for name, folder in folders.items()}

    def answer(model: str, ask: Ask, max_tokens: int) -> str:
        detokenizer = load_tokenizer(folders[model]).detokenizer
        detokenizer.reset()
        for token in tokens(*loaded[model], ask, max_tokens):
            detokenizer.add_token(token)
        detokenizer.finalize()
        return str(detokenizer.text)

    return answer


def content(ask: Ask) -> list[dict[str, Any]]:
    assert ask.image is not None
    return [{"type": "image_url", "image_url": {"url": data_url(ask.image)}}, {"type": "text", "text": ask.text}]


def test_the_openai_client_gets_each_new_familys_own_answer_and_a_stream(worker, live_server, reference):
    from openai import OpenAI

    client = OpenAI(base_url=f"{live_server}/v1", api_key="unused", max_retries=0)
    for model in MODELS:
        for ask in ASKS[:2]:
            answer = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": content(ask)}],  # type: ignore[misc, list-item]
                max_tokens=10,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            assert answer.choices[0].message.content == reference(model, ask, 10), (model, ask.text)
    # a stream is the same answer, piece by piece
    stream = client.chat.completions.create(
        model="llava",
        messages=[{"role": "user", "content": content(ASKS[2])}],  # type: ignore[misc, list-item]
        max_tokens=10,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == reference("llava", ASKS[2], 10)
    # and the models say how their image prompts run
    listed = {m["id"]: m for m in requests.get(f"{live_server}/v1/models", timeout=10).json()["data"]}
    assert (listed["llava"]["images"], listed["llama-vision"]["images"], listed["chat"]["images"]) == (
        "batched",
        "alone",
        None,
    )


def test_an_image_job_running_alone_is_cancelled_and_the_lane_goes_on(worker, live_server, store, reference):
    # Given a long answer about an image on the model whose image jobs run alone, streaming
    body = {
        "model": "llama-vision",
        "messages": [{"role": "user", "content": content(ASKS[0])}],
        "max_tokens": 2000,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    with requests.post(f"{live_server}/v1/chat/completions", json=body, stream=True, timeout=120) as stream:
        chunks = openai_chunks(stream)
        next(chunks)
        running = stream.headers["x-onelane-job-id"]
        # When its client cancels it
        gone = requests.delete(f"{live_server}/v1/jobs/{running}", timeout=10)
        assert gone.status_code == 200, gone.text
        # (its stream ends saying so)
        ending = [line for line in stream.iter_lines(decode_unicode=True) if "job_cancelled" in line]
        assert ending, "the stream did not say the job was cancelled"
    assert store.get(running).status == JobStatus.CANCELLED
    assert (store.get(running).usage.completion_tokens or 0) < 2000
    # Then the next image question on that model is answered, as mlx-vlm answers it
    again = dict(body, messages=[{"role": "user", "content": content(ASKS[1])}], max_tokens=8, stream=False)
    reply = requests.post(f"{live_server}/v1/chat/completions", json=again, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == reference("llama-vision", ASKS[1], 8)
