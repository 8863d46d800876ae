"""A tiny Mage-VL (`mage_vl`, as the Mage-VL checkpoints ship it): a Mage-ViT tower (16x16 patches, no temporal
patching, a 3-D RoPE split 4:6:6 of its 32-wide heads; hidden 64, 2 layers) merging 2x2 patches into an image token, and a stock Qwen 3 text model
(hidden 64, 2 layers, plain 1-D RoPE). Its processor is Qwen3-VL's (the image processor mlx-vlm ports to numpy):
<|vision_start|><|image_pad|><|vision_end|> with one <|image_pad|> per 2x2 patches; tokens and template Qwen3-VL's
(tests/vlms/qwen.py). Keys as the hub's: `model.language_model.*`, `model.visual.*`, `lm_head.*`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import Family, write_folder
from tests.vlms.qwen import EOS, IDS, IMAGE_PROCESSOR, TEMPLATE3, TEXT, TOKENS

PATCH = 16
CONFIG: dict[str, Any] = dict(
    architectures=["MageVLForConditionalGeneration"], model_type="mage_vl",
    text_config=dict(
        model_type="qwen3", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=TEXT["vocab_size"], max_position_embeddings=4096,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0), tie_word_embeddings=False,
    ),
    vision_config=dict(
        model_type="mage_vl_vision", hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        patch_size=PATCH, spatial_merge_size=2, temporal_patch_size=1, out_hidden_size=64, text_hidden_size=64,
    ),
    image_token_id=IDS["<|image_pad|>"], video_token_id=IDS["<|video_pad|>"],
    vision_start_token_id=IDS["<|vision_start|>"], vision_end_token_id=IDS["<|vision_end|>"],
    eos_token_id=[EOS], tie_word_embeddings=False, torch_dtype="float32",
)  # fmt: skip


def _hub_key(name: str) -> str:
    for mine, hub in (("language_model.model.", "model.language_model."), ("language_model.lm_head", "lm_head")):
        if name.startswith(mine):
            return hub + name[len(mine) :]
    return name.replace("vision_tower.", "model.visual.", 1)


def build_mage_vl(folder: Path) -> Path:
    """A tiny Mage-VL."""
    return write_folder(
        folder,
        Family(
            module="mage_vl",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE3,
            eos=EOS,
            tokenizer=dict(
                processor_class="MageVLProcessor",
                image_token="<|image_pad|>",
                video_token="<|video_pad|>",
                bos_token=None,
            ),
            processor=dict(processor_class="MageVLProcessor"),
            image_processor=dict(
                IMAGE_PROCESSOR,
                patch_size=PATCH,
                temporal_patch_size=1,
                min_pixels=(PATCH * 2) ** 2,
                max_pixels=(PATCH * 2 * 4) ** 2,
                processor_class="MageVLProcessor",
            ),
            prepend_bos=False,
            hub_key=_hub_key,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"mage_vl": build_mage_vl}
