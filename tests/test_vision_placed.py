"""A model whose image features go where its processor says (worker/vision_reading.py: MiniCPM-V's `image_bound`,
Jina VLM's `image_input_idx`): two prompts about the same image, one with a system message before it and one
without, are prepared one after the other, so that the arrays kept for the image are the second's, whose places lie
elsewhere in its prompt; both, inserted at once, answer as mlx-vlm answers each alone."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tasks.job import JobSpec, Message, Picture, SamplingParams
from tests.vision_batch import load, png
from tests.vlms.jina import ARCHS as JINA
from tests.vlms.minicpm import ARCHS as MINICPM

pytestmark = pytest.mark.timeout(300)

MAX_TOKENS = 8
ARCHS = {"minicpmv4_6": MINICPM["minicpmv4_6"], "jina_vlm": JINA["jina_vlm"]}
IMAGE = png("white", (80, 30), checker=True)
SYSTEM = "You answer about pictures in very few words."
QUESTION = "What is this?"


def conversation(system: bool) -> list[tuple[str, str, bool]]:
    """(role, words, whether the image comes first) of each turn."""
    return [*([("system", SYSTEM, False)] if system else []), ("user", QUESTION, True)]


def job(name: str, turns: list[tuple[str, str, bool]]) -> JobSpec:
    digest = hashlib.sha256(IMAGE).hexdigest()
    messages = tuple(
        Message(role=role, content=words, images=(Picture(digest=digest, at=0),) if image else ())
        for role, words, image in turns
    )
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    return JobSpec(owner="t", model=name, messages=messages, params=params)


def reference(vlm: Any, processor: Any, turns: list[tuple[str, str, bool]]) -> list[int]:
    """mlx-vlm's own greedy tokens for the conversation alone."""
    import mlx_vlm
    from mlx_vlm.prompt_utils import apply_chat_template

    messages = [
        {"role": role, "content": [*([{"type": "image"}] if image else []), {"type": "text", "text": words}]}
        for role, words, image in turns
    ]
    prompt = apply_chat_template(processor, vlm.config, messages, num_images=1)
    image = Image.open(io.BytesIO(IMAGE)).convert("RGB")
    out = mlx_vlm.stream_generate(
        vlm, processor, prompt, image=[image], max_tokens=MAX_TOKENS, temperature=0.0, eos_tokens=[]
    )
    return [int(o.token) for o in out][:MAX_TOKENS]


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_a_kept_images_places_move_with_the_prompt_that_reads_them(arch: str, tmp_path: Path) -> None:
    import mlx_vlm

    # Given the model served by onelane, and mlx-vlm's own load of the same folder
    folder = ARCHS[arch](tmp_path / arch)
    engine = load(folder, arch)
    vlm, processor = mlx_vlm.load(str(folder))
    images = {hashlib.sha256(IMAGE).hexdigest(): IMAGE}
    # When a prompt with a system message, then one without, are prepared (the image's arrays kept are the second's)
    # and both are inserted at once
    turns = [conversation(system=True), conversation(system=False)]
    prompts = [engine.prompt_tokens(job(arch, t), images) for t in turns]
    assert engine.placed
    first = [i for i, t in enumerate(prompts[0]) if t >= engine.tags][0]
    assert first != [i for i, t in enumerate(prompts[1]) if t >= engine.tags][0]  # (the places differ)
    uids = {engine.insert(p, job(arch, t).params): n for n, (p, t) in enumerate(zip(prompts, turns))}
    got: list[list[int]] = [[] for _ in turns]
    for _ in range(200):
        if not engine.size:
            break
        for token in engine.step():
            got[uids[token.uid]].append(token.token)
    # Then each answers as mlx-vlm alone
    assert got == [reference(vlm, processor, t) for t in turns]
    engine.close()
