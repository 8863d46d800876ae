"""A tiny Cohere Compass (`cohere_compass`, as CohereLabs' North-Micro-Vision-Instruct ships it): a packed
native-resolution vision tower as Qwen3-VL's (16x16 patches, temporal patches of 2, merged 2x2: a 32x32 block is one
image token; hidden 32, 2 layers, deepstack features from its first layer), and a Command-style text model (hidden 64,
2 layers of parallel attention and SwiGLU over one layer norm, 4 query heads, 2 KV heads of 16, M-RoPE in sections
[2, 3, 3], logits scaled by 1/16). Its processor (mlx-vlm's own) writes an image as <|VISION_START|>, one
<|IMAGE_PAD|> per 2x2 patches, <|VISION_END|>; the template is Aya Vision's Cohere turns (tests/vlms/aya.py) with the
image written so. Keys as mlx-vlm names them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.aya import TEMPLATE as AYA_TEMPLATE
from tests.vlms.aya import TOKENS as TURN_TOKENS
from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, START, Family, added_ids, write_folder

TOKENS = [*TURN_TOKENS[:5], "<|VISION_START|>", "<|VISION_END|>", "<|IMAGE_PAD|>"]
IDS = added_ids(TOKENS)
PATCH, MERGE = 16, 2
EOS = IDS["<|END_OF_TURN_TOKEN|>"]
KINDS = ("sliding_attention", "full_attention")
TEXT: dict[str, Any] = dict(
    model_type="cohere_compass_text", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=DEMO_VOCAB + len(TOKENS),
    max_position_embeddings=4096, layer_norm_eps=1e-5, norm_type="layer_norm", transformer_block_type="parallel",
    layer_types=["sliding_attention", "full_attention"], sliding_window=4096, logit_scale=0.0625,
    rope_parameters={kind: dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3]) for kind in KINDS},
    tie_word_embeddings=False, eos_token_id=EOS,
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["CohereCompassForConditionalGeneration"], model_type="cohere_compass", text_config=TEXT,
    vision_config=dict(
        model_type="cohere_compass_vision", depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
        patch_size=PATCH, spatial_merge_size=MERGE, temporal_patch_size=2, out_hidden_size=64,
        num_position_embeddings=16, deepstack_visual_indexes=[0],
    ),
    image_token_id=IDS["<|IMAGE_PAD|>"], vision_start_token_id=IDS["<|VISION_START|>"],
    vision_end_token_id=IDS["<|VISION_END|>"], min_pixels=(PATCH * MERGE) ** 2, max_pixels=(PATCH * MERGE * 3) ** 2,
    bos_token_id=DEMO_IDS[START], eos_token_id=EOS, torch_dtype="float32",
)  # fmt: skip


def build_cohere_compass(folder: Path) -> Path:
    """A tiny Cohere Compass (North-Micro-Vision-Instruct's layout)."""
    return write_folder(
        folder,
        Family(
            module="cohere_compass",
            config=CONFIG,
            tokens=TOKENS,
            template=AYA_TEMPLATE.replace("<image>", "<|VISION_START|><|IMAGE_PAD|><|VISION_END|>"),
            eos=EOS,
            tokenizer=dict(eos_token="<|END_OF_TURN_TOKEN|>", processor_class="CohereCompassProcessor"),
            processor=dict(processor_class="CohereCompassProcessor"),
            image_processor=dict(
                processor_class="CohereCompassProcessor",
                patch_size=PATCH,
                temporal_patch_size=2,
                merge_size=MERGE,
                min_pixels=(PATCH * MERGE) ** 2,
                max_pixels=(PATCH * MERGE * 3) ** 2,
            ),
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"cohere_compass": build_cohere_compass}
