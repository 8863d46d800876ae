"""A tiny MiniMax-M3-VL (`minimax_m3_vl`, as MiniMaxAI's MiniMax-M3 ships it): a CLIP-style tower with 3-D RoPE (14x14
patches, temporal patches of 2, merged 2x2; hidden 32, 2 layers), the projector, and a MiniMax-M3 text model (hidden
64, 2 layers: the first dense, the second a mixture of 2 experts and a shared one; sparse attention off; a
`get_rope_index` that takes the images' grids but gives plain positions). Its processor writes an image as ]<]start of image[>[, one ]<]image[>[
per 2x2 patches, ]<]end of image[>[ in place of the template's ]<]image[>[; the template is ChatML's. Keys as mlx-vlm
names them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, END, Family, added_ids, write_folder
from tests.vlms.molmo import TEMPLATE2

TOKENS = ["]<]image[>[", "]<]video[>[", "]<]start of image[>[", "]<]end of image[>["]
IDS = added_ids(TOKENS)
EOS = DEMO_IDS[END]
PATCH = 14
TEXT: dict[str, Any] = dict(
    model_type="minimax_m3", hidden_size=64, intermediate_size=32, dense_intermediate_size=128,
    shared_intermediate_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=2,
    max_position_embeddings=4096, vocab_size=DEMO_VOCAB + len(TOKENS), num_local_experts=2, num_experts_per_tok=1,
    moe_layer_freq=[0, 1], sparse_attention_config=dict(use_sparse_attention=False), rope_theta=10000.0,
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["MiniMaxM3VLForConditionalGeneration"], model_type="minimax_m3_vl", text_config=TEXT,
    vision_config=dict(
        model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_hidden_layers=2, image_size=112, patch_size=PATCH, projection_dim=64,
    ),
    image_token_index=IDS["]<]image[>["], video_token_index=IDS["]<]video[>["],
    vision_start_token_id=IDS["]<]start of image[>["], vision_end_token_id=IDS["]<]end of image[>["],
    projector_hidden_size=64, vocab_size=TEXT["vocab_size"], eos_token_id=EOS, torch_dtype="float32",
)  # fmt: skip


def build_minimax_m3_vl(folder: Path) -> Path:
    """A tiny MiniMax-M3-VL."""
    return write_folder(
        folder,
        Family(
            module="minimax_m3_vl",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE2.replace("<|image|>", "]<]image[>["),
            eos=EOS,
            tokenizer=dict(bos_token=None, processor_class="MiniMaxM3VLProcessor"),
            processor=dict(processor_class="MiniMaxM3VLProcessor"),
            image_processor=dict(
                processor_class="MiniMaxM3VLProcessor",
                patch_size=PATCH,
                temporal_patch_size=2,
                merge_size=2,
                min_pixels=(PATCH * 2) ** 2,
                max_pixels=(PATCH * 2 * 4) ** 2,
                min_short_side_pixel=PATCH * 2,
                max_total_pixels=(PATCH * 2 * 4) ** 2,
            ),
            prepend_bos=False,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"minimax_m3_vl": build_minimax_m3_vl}
