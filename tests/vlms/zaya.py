"""A tiny ZAYA1-VL (`zaya1_vl`, as Zyphra's ZAYA1-VL ships it): Qwen2.5-VL's vision tower (14x14 patches merged 2x2,
hidden 32, 2 layers) and ZAYA1's text model (hidden 64, 2 blocks: compressed convolutional attention, whose
convolution state is cached beside its KV, and a mixture of 2 experts; low-rank adapters applied to the image's
tokens only, which mlx-vlm's embeddings mark as `visual_pos_masks`). Its config is flat (the text model's settings
at the top, beside `vision_config`). Its processor (Qwen3-VL's image processor) writes one <image> per 2x2 patches in
place of the template's one; the template is ChatML's, an image part rendering <|vision_start|><image><|vision_end|>.
Keys as mlx-vlm names them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, END, Family, added_ids, write_folder
from tests.vlms.molmo import TEMPLATE2
from tests.vlms.qwen import IMAGE_PROCESSOR

TOKENS = ["<|vision_start|>", "<|vision_end|>", "<image>"]
IDS = added_ids(TOKENS)
EOS = DEMO_IDS[END]
CONFIG: dict[str, Any] = dict(
    architectures=["ZayaVLForConditionalGeneration"], model_type="zaya1_vl", vocab_size=DEMO_VOCAB + len(TOKENS),
    hidden_size=64, ffn_hidden_size=128, num_hidden_layers=2, num_experts=2, num_attention_heads=4, head_dim=16,
    num_query_groups=2, num_key_value_heads=2, max_position_embeddings=4096, zaya_mlp_expansion=16,
    vision_lora_rank_attn=4, vision_lora_rank_mlp=4, tie_word_embeddings=False, pad_token_id=0, bos_token_id=EOS,
    eos_token_id=EOS, image_token_id=IDS["<image>"], vision_start_token_id=IDS["<|vision_start|>"],
    vision_end_token_id=IDS["<|vision_end|>"], torch_dtype="float32",
    vision_config=dict(
        model_type="qwen2_5_vl", depth=2, hidden_size=32, intermediate_size=64, out_hidden_size=64, num_heads=2,
        patch_size=14, spatial_patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3,
        window_size=56, fullatt_block_indexes=[1],
    ),
)  # fmt: skip
TEMPLATE = TEMPLATE2.replace("<|image|>", "<|vision_start|><image><|vision_end|>")


def build_zaya1_vl(folder: Path) -> Path:
    """A tiny ZAYA1-VL."""
    return write_folder(
        folder,
        Family(
            module="zaya1_vl",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=EOS,
            tokenizer=dict(bos_token=None, image_token="<image>", processor_class="Zaya1VLProcessor"),
            processor=dict(processor_class="Zaya1VLProcessor"),
            image_processor=dict(IMAGE_PROCESSOR, processor_class="Zaya1VLProcessor"),
            prepend_bos=False,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"zaya1_vl": build_zaya1_vl}
