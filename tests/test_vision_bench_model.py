"""The Qwen2.5-VL that `bench/vision.py --arch qwen2_5_vl` serves (tests/vlms/qwen.py's build_qwen2_5_vl with the
bench's QWEN2_5_VL_SIZES): the bench's 320x240 images become the image tokens its docstring says, and onelane's
answers to three of them asked at once (questions of different lengths) equal mlx-vlm's for each alone, so the bench
compares the two servers on the same work. Its sizes are checked as they are given."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from bench.vision import QUESTION, QWEN2_5_VL_SIZES, VARIED, image_url
from tests.vision_batch import Ask, load, reference, together
from tests.vlms.qwen import IDS, IMAGE_PROCESSOR, QWEN2_5_VL, build_qwen2_5_vl, qwen2_5_vl_sizes

TOKENS = 8
IMAGE_TOKENS = 63  # 320x240 resized to 196x252 (max_pixels 72 * 28 * 28): 7 x 9 blocks of 28x28


def bench_png(n: int) -> bytes:
    """The bench's n-th image, as its data: URL carries it."""
    return base64.b64decode(image_url(n).split(",", 1)[1])


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen2_5_vl(tmp_path_factory.mktemp("bench") / "qwen2_5_vl", **QWEN2_5_VL_SIZES)


@pytest.fixture(scope="module")
def engine(folder: Path) -> Iterator[Any]:
    engine = load(folder, "qwen2_5_vl")
    yield engine
    engine.close()


def test_an_image_is_63_tokens_and_answers_equal_mlx_vlm_alone(folder: Path, engine: Any) -> None:
    import mlx_vlm
    from mlx_vlm.prompt_utils import apply_chat_template

    vlm, processor = mlx_vlm.load(str(folder))
    prompt = apply_chat_template(processor, vlm.config, QUESTION, num_images=1)
    ids = processor(text=[prompt], images=[Image.open(io.BytesIO(bench_png(0)))], return_tensors="np")["input_ids"]
    assert int((ids == IDS["<|image_pad|>"]).sum()) == IMAGE_TOKENS

    asks = [Ask(question, bench_png(n)) for n, question in enumerate([QUESTION, VARIED[1], VARIED[2]])]
    answers = together(engine, asks, TOKENS)
    assert answers == [reference(vlm, processor, ask, TOKENS) for ask in asks]


def test_sizes() -> None:
    assert qwen2_5_vl_sizes() == (QWEN2_5_VL, IMAGE_PROCESSOR)  # none: the tiny folder of ARCHS
    config, image_processor = qwen2_5_vl_sizes(**QWEN2_5_VL_SIZES)
    assert config["vision_config"]["out_hidden_size"] == config["hidden_size"] == 256
    assert image_processor["size"] == dict(shortest_edge=28 * 28, longest_edge=72 * 28 * 28)
    with pytest.raises(ValueError, match="unknown Qwen2.5-VL sizes"):
        qwen2_5_vl_sizes(hidden=256)
    with pytest.raises(ValueError, match="half a head"):
        qwen2_5_vl_sizes(hidden_size=256, num_attention_heads=4)  # heads of 64; the tiny sections add up to 8
    with pytest.raises(ValueError, match="max_pixels"):
        qwen2_5_vl_sizes(max_pixels=100)
