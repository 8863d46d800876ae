"""A tiny random-weight GLM-4V folder (M-RoPE, like Qwen's: positions that depend on the image), built offline.

In the spirit of tests/tiny_vision.py: the layout of zai-org/GLM-4.1V-9B-Thinking (`Glm4vForConditionalGeneration`,
model_type "glm4v"), a vision tower of patch 14, merge 2 (hidden 32, 2 layers: a 56x56 image is 4 tokens), a text
model of hidden 64, 2 layers, 4 heads of 16, 2 KV heads, half of each head rotated (partial_rotary_factor 0.5), its
rotation in three sections [2, 1, 1] (time, height, width). Added tokens (ids 2048 on) as GLM-4.1V's: [gMASK],
<sop>, <|system|>, <|user|>, <|assistant|>, <|begin_of_image|>, <|end_of_image|>, <|image|>, <|begin_of_video|>,
<|end_of_video|>, <|video|>, <|begin_of_box|>, <|end_of_box|>; the hub's chat template (its image part renders
<|begin_of_image|><|image|><|end_of_image|>, which mlx-vlm's Glm46VProcessor expands to the grid / 4 <|image|>s),
the image processor transformers' Glm4vImageProcessor. The weights keep mlx-vlm's own names and layouts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.tiny_kinds import parameters, save_weights, seeded, write_json
from tests.tiny_vision import DEMO_IDS, DEMO_VOCAB, END, PAD, _model_config, _write_generation_config, _write_tokenizer

TOKENS = [
    "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|begin_of_image|>", "<|end_of_image|>",
    "<|image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|video|>", "<|begin_of_box|>", "<|end_of_box|>",
]  # fmt: skip
IDS = {token: DEMO_VOCAB + i for i, token in enumerate(TOKENS)}
PATCH, MERGE = 14, 2
EOS = [DEMO_IDS[END], IDS["<|user|>"]]

#: GLM-4.1V's template (zai-org/GLM-4.1V-9B-Thinking), without its thinking and tool branches
TEMPLATE = (
    "[gMASK]<sop>{%- for msg in messages %}{%- if msg.role == 'system' %}<|system|>\n{{ msg.content }}"
    "{%- elif msg.role == 'user' %}<|user|>{{ '\\n' }}{%- if msg.content is string %}{{ msg.content }}{%- else %}"
    "{%- for item in msg.content %}{%- if item.type == 'video' or 'video' in item %}"
    "<|begin_of_video|><|video|><|end_of_video|>{%- elif item.type == 'image' or 'image' in item %}"
    "<|begin_of_image|><|image|><|end_of_image|>{%- elif item.type == 'text' %}{{ item.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}{%- elif msg.role == 'assistant' %}<|assistant|>{{ '\\n' }}{{ msg.content }}"
    "{%- endif %}{%- endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="Glm4vImageProcessor", processor_class="Glm46VProcessor", do_convert_rgb=True,
    do_normalize=True, do_rescale=True, do_resize=True, image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711], size=dict(shortest_edge=(PATCH * MERGE) ** 2,
    longest_edge=(PATCH * MERGE * 4) ** 2), patch_size=PATCH, temporal_patch_size=2, merge_size=MERGE, resample=3,
    rescale_factor=1 / 255,
)  # fmt: skip
TEXT: dict[str, Any] = dict(
    model_type="glm4v_text", vocab_size=DEMO_VOCAB + len(TOKENS), hidden_size=64, intermediate_size=128,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
    rms_norm_eps=1e-5, rope_theta=10000.0, attention_bias=True, partial_rotary_factor=0.5,
    rope_scaling=dict(rope_type="default", mrope_section=[2, 1, 1]), eos_token_id=EOS, pad_token_id=DEMO_IDS[PAD],
    torch_dtype="float32",
)  # fmt: skip
VISION: dict[str, Any] = dict(
    model_type="glm4v", depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=PATCH,
    image_size=PATCH * MERGE * 2, out_hidden_size=TEXT["hidden_size"], spatial_merge_size=MERGE,
    temporal_patch_size=2, in_channels=3, torch_dtype="float32",
)  # fmt: skip
GLM4V: dict[str, Any] = dict(
    architectures=["Glm4vForConditionalGeneration"], model_type="glm4v", text_config=TEXT, vision_config=VISION,
    vocab_size=TEXT["vocab_size"], hidden_size=TEXT["hidden_size"], image_token_index=IDS["<|image|>"],
    image_token_id=IDS["<|image|>"], video_token_index=IDS["<|video|>"], video_token_id=IDS["<|video|>"],
    vision_start_token_id=IDS["<|begin_of_image|>"], vision_end_token_id=IDS["<|end_of_image|>"],
    pad_token_id=DEMO_IDS[PAD], eos_token_id=EOS, torch_dtype="float32",
)  # fmt: skip


def _glm4v(folder: Path) -> None:
    from mlx_vlm.models import glm4v

    folder.mkdir(parents=True, exist_ok=True)
    save_weights(folder, parameters(seeded(lambda: glm4v.Model(_model_config(glm4v, GLM4V)))))
    write_json(folder / "config.json", GLM4V)
    _write_generation_config(folder, EOS)
    settings = dict(processor_class="Glm46VProcessor", image_token="<|image|>", video_token="<|video|>")
    _write_tokenizer(folder, TOKENS, settings, TEMPLATE, prepend_bos=False)
    write_json(folder / "processor_config.json", {"processor_class": "Glm46VProcessor"})
    write_json(folder / "preprocessor_config.json", IMAGE_PROCESSOR)


ARCHS: dict[str, Callable[[Path], None]] = {"glm4v": _glm4v}
