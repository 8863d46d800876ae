"""Tiny LLaVA-NeXT folders (`llava_next`: llava-hf/llava-v1.6-mistral-7b-hf's layout) that `mlx_vlm.load` reads
offline (tests/tiny_vision.py says how such a folder is built).

A CLIP tower (28x28 crops, 14x14 patches: 4 patches, hidden 32, 2 layers), the two-layer projector and a Llama
(hidden 64, 2 layers, 4 heads, 2 KV heads, untied lm_head). The image processor tiles an image by
`image_grid_pinpoints` (28x28 and 28x56 here, so that a wide and a square image give different numbers of image
tokens); LlavaNextProcessor writes as many <image> tokens as the transformers model would read, and mlx-vlm's own
`get_input_embeddings` puts each crop's features (and then as many `image_newline`s) in place of the first image
tokens: its embeddings are longer than the prompt's ids (an "expanding" model, worker/vision_reading.py). Added
tokens: <image> 2048 (image_token_index), <s>-less: the template is Mistral's `[INST] … [/INST]` over the demo
tokenizer (BOS <|im_start|> prepended).

Plain `llava` is built by tests/vlms/llava15.py.
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
    _added_ids,
    _model_config,
    _torch_conv,
    _write_generation_config,
    _write_tokenizer,
)

TOKENS = ["<image>"]
IDS = _added_ids(TOKENS)
SIZE, PATCH = 28, 14
TEXT: dict[str, Any] = dict(
    model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=2048 + len(TOKENS), rope_theta=10000.0,
    max_position_embeddings=4096, tie_word_embeddings=False, torch_dtype="float32",
)  # fmt: skip
VISION: dict[str, Any] = dict(
    model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
    image_size=SIZE, patch_size=PATCH, projection_dim=32, num_channels=3, layer_norm_eps=1e-5, torch_dtype="float32",
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["LlavaNextForConditionalGeneration"], model_type="llava_next", text_config=TEXT,
    vision_config=VISION, image_token_index=IDS["<image>"], vision_feature_select_strategy="default",
    vision_feature_layer=-2, image_grid_pinpoints=[[SIZE, SIZE], [SIZE, 2 * SIZE]], vocab_size=TEXT["vocab_size"],
    pad_token_id=DEMO_IDS[PAD], eos_token_id=DEMO_IDS[END], tie_word_embeddings=False, torch_dtype="float32",
)  # fmt: skip
#: Mistral's template as llava-v1.6-mistral's chat_template.json has it (its <s> the demo BOS, prepended)
TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}{{ '<image>\n' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}{{ ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' }}{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for item in message['content'] %}{{ item['text'] }}{% endfor %}{% endif %}"
    "{{ '<|im_end|>' }}{% endif %}{% endfor %}"
)
IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="LlavaNextImageProcessor", processor_class="LlavaNextProcessor", do_convert_rgb=True,
    do_normalize=True, do_pad=True, do_rescale=True, do_resize=True, do_center_crop=True,
    crop_size=dict(height=SIZE, width=SIZE), size=dict(shortest_edge=SIZE),
    image_grid_pinpoints=CONFIG["image_grid_pinpoints"], image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    resample=3, rescale_factor=1 / 255,
)  # fmt: skip
CONV = "vision_tower.vision_model.embeddings.patch_embedding.weight"


def build_llava_next(folder: Path) -> None:
    """Write a tiny LLaVA-NeXT (see the module's docstring) into `folder`."""
    from mlx_vlm.models import llava_next

    folder.mkdir(parents=True, exist_ok=True)
    weights = parameters(seeded(lambda: llava_next.Model(_model_config(llava_next, CONFIG))))
    weights[CONV] = _torch_conv(weights[CONV])
    save_weights(folder, weights)
    write_json(folder / "config.json", CONFIG)
    _write_generation_config(folder, DEMO_IDS[END])
    settings = dict(image_token="<image>", processor_class="LlavaNextProcessor")
    _write_tokenizer(folder, TOKENS, settings, TEMPLATE)
    processor = dict(
        patch_size=PATCH, vision_feature_select_strategy="default", image_token="<image>",
        num_additional_image_tokens=1, processor_class="LlavaNextProcessor",
    )  # fmt: skip
    write_json(folder / "processor_config.json", processor)
    write_json(folder / "preprocessor_config.json", IMAGE_PROCESSOR)


ARCHS: dict[str, Callable[[Path], None]] = {"llava_next": build_llava_next}
