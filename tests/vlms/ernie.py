"""A tiny ERNIE 4.5 VL (`ernie4_5_moe_vl`, as baidu/ERNIE-4.5-VL-28B-A3B-PT ships it): a DFN-RoPE vision tower of
patch 14 (embed 32, 2 layers), the resampler merging 2x2 patches (and 2 frames) into an image token, and an ERNIE
4.5 text model of hidden 64, 2 layers, 4 query heads and 2 KV heads of 16, 3-D rotary positions (sections h 3, w 3,
t 2: M-RoPE, an image's tokens placed by their row and column), the second layer a mixture of experts: 4 text
experts and 4 multimodal ones, 2 a token, beside a shared one. Its tokenizer is SentencePiece (tests/vlms/spm.py:
mlx-vlm's Ernie4_5_VLProcessor reads tokenizer.model with its own Ernie4_5_VLTokenizer; no tokenizer.json, as the
hub's has none), with ERNIE's special
tokens; the image processor is the processor's own (patch 14, merge 2, at least 56x56 pixels). The chat template is
the hub's turns ("<|begin_of_sentence|>User: … \nAssistant: "), an image part written
"Picture n:<|IMAGE_START|><|image@placeholder|><|IMAGE_END|>", which the processor expands to one
<|IMAGE_PLACEHOLDER|> per 2x2 patches. Keys as the hub names them (`model.layers.*`, `vision_model.*`,
`model.resampler_model.*`, `lm_head.*`: mlx-vlm's sanitize maps them back), the experts stacked."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import Family, write_folder
from tests.vlms.spm import BOS, EOS, vocab_size, write_spm_tokenizer

SPECIALS = [
    "<|begin_of_sentence|>", "<|end_of_sentence|>", "<|IMAGE_PLACEHOLDER|>", "<|IMAGE_START|>", "<|IMAGE_END|>",
    "<|VIDEO_START|>", "<|VIDEO_END|>", "<|image@placeholder|>", "<mask:1>", "<mask:7>",
]  # fmt: skip
IDS = {token: 3 + i for i, token in enumerate(SPECIALS)}
END = IDS["<|end_of_sentence|>"]
TEMPLATE = (
    "{%- set image_count = namespace(value=0) -%}{{- '<|begin_of_sentence|>' -}}"
    "{%- for message in messages -%}{%- if message['role'] == 'user' -%}{{- 'User: ' -}}"
    "{%- elif message['role'] == 'assistant' -%}{{- 'Assistant: ' -}}{%- endif -%}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}{%- else -%}"
    "{%- for part in message['content'] -%}{%- if part['type'] in ('image', 'image_url') -%}"
    "{%- set image_count.value = image_count.value + 1 -%}"
    "Picture {{ image_count.value }}:<|IMAGE_START|><|image@placeholder|><|IMAGE_END|>"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}{{- '<|end_of_sentence|>' -}}{%- else -%}{{- '\\n' -}}{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{- 'Assistant: ' -}}{%- endif -%}"
)
CONFIG: dict[str, Any] = dict(
    architectures=["Ernie4_5_VLMoeForConditionalGeneration"], model_type="ernie4_5_moe_vl", hidden_size=64,
    intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    rms_norm_eps=1e-5, vocab_size=vocab_size(SPECIALS), max_position_embeddings=4096, rope_theta=500000.0,
    use_bias=False, tie_word_embeddings=False, moe_num_experts=[4, 4], moe_layer_start_index=1,
    moe_layer_end_index=1, moe_intermediate_size=[32, 32], moe_k=2, moe_layer_interval=1, moe_num_shared_experts=1,
    moe_gate_act="softmax", moe_use_aux_free=True, rope_3d=True, freq_allocation=2, mrope_section=[3, 3, 2],
    im_patch_id=IDS["<|IMAGE_PLACEHOLDER|>"], image_token_id=IDS["<|IMAGE_PLACEHOLDER|>"],
    video_token_id=IDS["<|IMAGE_PLACEHOLDER|>"], image_start_token_id=IDS["<|IMAGE_START|>"],
    image_end_token_id=IDS["<|IMAGE_END|>"], video_start_token_id=IDS["<|VIDEO_START|>"],
    video_end_token_id=IDS["<|VIDEO_END|>"], bos_token_id=1, eos_token_id=[2, END], pad_token_id=0,
    pixel_hidden_size=32, spatial_conv_size=2, temporal_conv_size=2, use_temporal_conv=True,
    vision_config=dict(
        model_type="DFNRope_vision_transformer", depth=2, embed_dim=32, hidden_size=32, hidden_act="quick_gelu",
        mlp_ratio=2.0, num_heads=2, in_channels=3, patch_size=14, spatial_merge_size=2,
    ),
    torch_dtype="float32",
)  # fmt: skip


def hub_key(name: str) -> str:
    """An ERNIE 4.5 VL weight as the hub names it."""
    name = re.sub(r"(spatial_linear|temporal_linear)\.layers\.(\d+)", r"\1.\2", name)
    for mine, hub in (
        ("language_model.model.", "model."),
        ("language_model.lm_head", "lm_head"),
        ("vision_tower.", "vision_model."),
        ("resampler_model.", "model.resampler_model."),
    ):
        if name.startswith(mine):
            return hub + name.removeprefix(mine)
    return name


def build_ernie4_5_moe_vl(folder: Path) -> Path:
    """A tiny ERNIE 4.5 VL (see the module's docstring)."""
    family = Family(
        module="ernie4_5_moe_vl", config=CONFIG, tokens=[], template=TEMPLATE, eos=[2, END], hub_key=hub_key,
        processor=dict(processor_class="Ernie4_5_VLProcessor", spatial_conv_size=2, temporal_conv_size=2),
    )  # fmt: skip
    write_folder(folder, family)
    settings = dict(
        tokenizer_class="Ernie4_5_VLTokenizer", bos_token=BOS, eos_token=EOS, unk_token="<unk>", pad_token="<unk>",
        cls_token="<|begin_of_sentence|>", sep_token="<|end_of_sentence|>", mask_token="<mask:1>",
        additional_special_tokens=["<mask:1>", "<mask:7>"], processor_class="Ernie4_5_VLProcessor",
    )  # fmt: skip
    write_spm_tokenizer(folder, SPECIALS, settings, TEMPLATE, fast=False)
    return folder


ARCHS: dict[str, Callable[[Path], Path]] = {"ernie4_5_moe_vl": build_ernie4_5_moe_vl}
