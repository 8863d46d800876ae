"""Tiny PaliGemma folders (`paligemma`: google/paligemma-3b-mix-224's layout) that `mlx_vlm.load` reads offline
(tests/tiny_vision.py says how such a folder is built).

A SigLIP tower (28x28 images, 14x14 patches: 4 image tokens, hidden 32, 2 layers), the linear projector and a Gemma
(hidden 64, 2 layers, 4 heads of 16, 1 KV head). PaliGemma reads its prefix (the image tokens, BOS, the question
and a newline) with bidirectional attention (`use_bidirectional_attention`, mlx-vlm's default for it), and mlx-vlm
reads such a prompt in one pass (its `chunked_prefill_policy`). It has no chat template: mlx-vlm renders a message
as its words after the image token. Added tokens: <image> 2048 (image_token_index); the processor adds PaliGemma's
1,152 <locNNNN>/<segNNN> tokens after it (the text model's vocab_size counts them), and writes the prompt as
`<image>` * 4, BOS (<|im_start|>), the words, a newline.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.tiny_kinds import parameters, save_weights, seeded, write_json
from tests.tiny_vision import (
    DEMO_IDS,
    END,
    PAD,
    START,
    _added_ids,
    _model_config,
    _torch_conv,
    _write_generation_config,
    _write_tokenizer,
)

TOKENS = ["<image>"]
IDS = _added_ids(TOKENS)
EXTRA = 1152  # PaliGemma's <loc> and <seg> tokens, which its processor adds
SIZE, PATCH = 28, 14
IMAGE_TOKENS = (SIZE // PATCH) ** 2
TEXT: dict[str, Any] = dict(
    model_type="gemma", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=1, head_dim=16, vocab_size=2048 + len(TOKENS) + EXTRA, rms_norm_eps=1e-6,
    max_position_embeddings=4096, num_image_tokens=IMAGE_TOKENS, torch_dtype="float32",
)  # fmt: skip
VISION: dict[str, Any] = dict(
    model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=2, patch_size=PATCH, projection_dim=TEXT["hidden_size"], image_size=SIZE, num_channels=3,
    layer_norm_eps=1e-6, torch_dtype="float32",
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["PaliGemmaForConditionalGeneration"], model_type="paligemma", text_config=TEXT,
    vision_config=VISION, image_token_index=IDS["<image>"], hidden_size=TEXT["hidden_size"],
    projection_dim=TEXT["hidden_size"], vocab_size=TEXT["vocab_size"], pad_token_id=DEMO_IDS[PAD],
    bos_token_id=DEMO_IDS[START], eos_token_id=DEMO_IDS[END], torch_dtype="float32",
)  # fmt: skip
IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="SiglipImageProcessor", processor_class="PaliGemmaProcessor", do_convert_rgb=None,
    do_normalize=True, do_rescale=True, do_resize=True, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    image_seq_length=IMAGE_TOKENS, resample=3, rescale_factor=1 / 255, size=dict(height=SIZE, width=SIZE),
)  # fmt: skip
CONV = "vision_tower.vision_model.embeddings.patch_embedding.weight"


def build_paligemma(folder: Path) -> None:
    """Write a tiny PaliGemma (see the module's docstring) into `folder`."""
    from mlx_vlm.models import paligemma

    folder.mkdir(parents=True, exist_ok=True)
    weights = parameters(seeded(lambda: paligemma.Model(_model_config(paligemma, CONFIG))))
    weights[CONV] = _torch_conv(weights[CONV])
    for name in [n for n in weights if n.endswith("norm.weight") and n.startswith("language_model.")]:
        weights[name] = (
            weights[name] + 1.0
        )  # (Gemma's RMSNorm scales by 1 + w: mlx-vlm's zeros would let one token win)
    save_weights(folder, weights)
    write_json(folder / "config.json", CONFIG)
    _write_generation_config(folder, DEMO_IDS[END])
    settings = dict(image_token="<image>", processor_class="PaliGemmaProcessor", chat_template=None)
    _write_tokenizer(folder, TOKENS, settings, "", prepend_bos=False)
    (folder / "chat_template.json").unlink()
    processor = dict(image_seq_length=IMAGE_TOKENS, processor_class="PaliGemmaProcessor")
    write_json(folder / "processor_config.json", processor)
    write_json(folder / "preprocessor_config.json", IMAGE_PROCESSOR)


ARCHS: dict[str, Callable[[Path], None]] = {"paligemma": build_paligemma}
