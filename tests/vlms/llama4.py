"""A tiny Llama 4 (`llama4`, as meta-llama/Llama-4-Scout-17B-16E-Instruct ships it): its vision encoder (56x56 tiles
in 14x14 patches, hidden 32, 2 layers, 2-D RoPE), the pixel-shuffle adapter (ratio 0.5: a tile is 4 image tokens)
and projector, and its text model (hidden 64, 2 layers, 4 query heads and 2 KV heads of 16, QK norm, the second
layer a mixture of 2 experts and a shared one, chunked attention over 16 tokens, the second layer without RoPE).
mlx-vlm's Llama4Processor (its NumPy image processor) reads an image as one 56x56 tile (max_patches 1):
<|image_start|>, <|image|>, 4 <|patch|>, <|image_end|>; the processor reads the patch size 14 itself, so the
tower's is 14. (Past one tile, mlx-vlm 0.7.10's processor writes the whole image's <|patch|> tokens after the tiles'
but gives the tower no whole-image tile: 12 image tokens for 8 features, and `get_input_embeddings` fills the rest
from past the end of its array, NaN in one run of three: undefined, alone as in a batch.) Added tokens: <|header_start|> 2048, <|header_end|>, <|eot|>
(its answers' end), the image's. The tokenizer prepends <|im_start|> as Llama's prepends <|begin_of_text|>. Keys as
the hub's: `language_model.model.*`, `language_model.lm_head.*`, `vision_model.*`, `multi_modal_projector.*` (the
experts stacked as mlx-vlm stacks them). transformers reads this config.json too (the tokenizer's load): its
attn_temperature_tuning must be a bool. Its chunked attention's cache cannot be merged: its sequences run alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, START, Family, added_ids, write_folder

TOKENS = [
    "<|header_start|>", "<|header_end|>", "<|eot|>", "<|image_start|>", "<|image_end|>", "<|image|>", "<|patch|>",
    "<|tile_x_separator|>", "<|tile_y_separator|>",
]  # fmt: skip
IDS = added_ids(TOKENS)
EOS = IDS["<|eot|>"]
TILE, PATCH = 56, 14
TEXT: dict[str, Any] = dict(
    model_type="llama4_text", hidden_size=64, intermediate_size=128, intermediate_size_mlp=128,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=2, rms_norm_eps=1e-5,
    vocab_size=DEMO_VOCAB + len(TOKENS), rope_theta=500000.0, rope_scaling=None, max_position_embeddings=4096,
    num_local_experts=2, num_experts_per_tok=1, interleave_moe_layer_step=2, moe_layers=[1], no_rope_layers=[1, 0],
    attention_chunk_size=16, use_qk_norm=True, attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1,
    tie_word_embeddings=False, bos_token_id=DEMO_IDS[START], eos_token_id=[EOS], pad_token_id=0,
    torch_dtype="float32",
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["Llama4ForConditionalGeneration"], model_type="llama4", text_config=TEXT,
    vision_config=dict(
        model_type="llama4_vision_model", hidden_size=32, image_size=TILE, initializer_range=0.02,
        intermediate_size=128, norm_eps=1e-5, num_attention_heads=2, num_channels=3, num_hidden_layers=2,
        patch_size=PATCH, pixel_shuffle_ratio=0.5, projector_dropout=0.0, projector_input_dim=64,
        projector_output_dim=64, rope_theta=10000, vision_feature_layer=-1, vision_feature_select_strategy="default",
        vision_output_dim=64,
    ),
    image_token_index=IDS["<|patch|>"], boi_token_index=IDS["<|image_start|>"],
    eoi_token_index=IDS["<|image_end|>"], eos_token_id=[EOS], tie_word_embeddings=False, torch_dtype="float32",
)  # fmt: skip
#: Llama 4's template's turns (without its default system prompt)
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|header_start|>' + message['role'] + '<|header_end|>\n\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' %}{{ '<|image|>' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|eot|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|header_start|>assistant<|header_end|>\n\n' }}"
    "{% endif %}"
)
IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="Llama4ImageProcessorFast", processor_class="Llama4Processor", do_convert_rgb=True,
    do_normalize=True, do_rescale=True, do_resize=True, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    max_patches=1, resample=2, rescale_factor=1 / 255, resize_to_max_canvas=False,
    size=dict(height=TILE, width=TILE),
)  # fmt: skip
PROCESSOR: dict[str, Any] = dict(
    processor_class="Llama4Processor", patch_size=PATCH, fake_image_token="<|image|>", image_token="<|image|>",
    start_of_image_token="<|image_start|>", end_of_image_token="<|image_end|>", patch_token="<|patch|>",
    tile_x_separator_token="<|tile_x_separator|>", tile_y_separator_token="<|tile_y_separator|>",
)  # fmt: skip


def build_llama4(folder: Path) -> Path:
    """A tiny Llama 4 (Llama-4-Scout's layout)."""
    return write_folder(
        folder,
        Family(
            module="llama4",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=EOS,
            tokenizer=dict(eos_token="<|eot|>", processor_class="Llama4Processor"),
            processor=PROCESSOR,
            image_processor=IMAGE_PROCESSOR,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"llama4": build_llama4}
