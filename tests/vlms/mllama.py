"""Tiny Llama 3.2 Vision folders (`mllama`: meta-llama/Llama-3.2-11B-Vision-Instruct's layout) that `mlx_vlm.load`
reads offline (tests/tiny_vision.py says how such a folder is built).

Llama 3.2 Vision reads its image through cross-attention: the prompt holds one <|image|> token, and the vision
tower's states (and, for the prompt, a mask saying which text rows see the image) go to the cross-attention layers
at every forward pass, the decode steps too (worker/vision_reading.py: such a model's image jobs run alone). Here: a
tower of 28x28 tiles (up to 4 by the image's aspect ratio), 14x14 patches, hidden 32, 2 local layers and 1 global,
its states 64 wide (the last layer's and one intermediate layer's); a Llama (hidden 64, 3 layers, the middle one
cross-attention, 4 heads, 2 KV heads). Added tokens: <|start_header_id|> 2048, <|end_header_id|> 2049, <|eot_id|>
2050 (eos), <|image|> 2051 (image_token_index: the text model's vocab_size, as Llama's 128256 is: it embeds it, and
never draws it). mlx-vlm initialises the tanh gates of the cross-attention layers and of the tower's global layers
and tile embeddings to zero, which would shut the image out: they are 1 here, as a checkpoint's are not zero.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.tiny_kinds import parameters, save_weights, seeded, write_json
from tests.tiny_vision import (
    DEMO_IDS,
    PAD,
    START,
    _added_ids,
    _model_config,
    _torch_conv,
    _write_generation_config,
    _write_tokenizer,
)

TOKENS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|image|>"]
IDS = _added_ids(TOKENS)
SIZE, PATCH = 28, 14
EOS = IDS["<|eot_id|>"]
TEXT: dict[str, Any] = dict(
    model_type="mllama", vocab_size=IDS["<|image|>"], hidden_size=64, intermediate_size=128, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=500000.0,
    max_position_embeddings=4096, cross_attention_layers=[1], tie_word_embeddings=False, torch_dtype="float32",
)  # fmt: skip
VISION: dict[str, Any] = dict(
    model_type="mllama_vision_model", image_size=SIZE, patch_size=PATCH, num_channels=3, hidden_size=32,
    intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, max_num_tiles=4,
    num_global_layers=1, norm_eps=1e-5, vision_output_dim=64, intermediate_layers_indices=[0], torch_dtype="float32",
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["MllamaForConditionalGeneration"], model_type="mllama", text_config=TEXT, vision_config=VISION,
    image_token_index=IDS["<|image|>"], vocab_size=TEXT["vocab_size"], pad_token_id=DEMO_IDS[PAD],
    bos_token_id=DEMO_IDS[START], eos_token_id=EOS, torch_dtype="float32",
)  # fmt: skip
#: Llama 3.2 Vision's template, its text shortened (no date, no tools): an image part renders <|image|>
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<|image|>' }}{% elif item['type'] == 'text' %}{{ item['text'] }}"
    "{% endif %}{% endfor %}{% endif %}{{ '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="MllamaImageProcessor", processor_class="MllamaProcessor", do_convert_rgb=True,
    do_normalize=True, do_pad=True, do_rescale=True, do_resize=True, image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5], max_image_tiles=4, resample=2, rescale_factor=1 / 255,
    size=dict(height=SIZE, width=SIZE),
)  # fmt: skip
CONV = "vision_tower.patch_embedding.weight"


def build_mllama(folder: Path) -> None:
    """Write a tiny Llama 3.2 Vision (see the module's docstring) into `folder`."""
    from mlx_vlm.models import mllama

    folder.mkdir(parents=True, exist_ok=True)
    weights = parameters(seeded(lambda: mllama.Model(_model_config(mllama, CONFIG))))
    weights[CONV] = _torch_conv(weights[CONV])
    for name in [n for n, w in weights.items() if "gate" in n and w.size == 1]:
        weights[name] = weights[name] + 1.0  # (mlx-vlm zeroes its tanh gates: a checkpoint's let the image through)
    save_weights(folder, weights)
    write_json(folder / "config.json", CONFIG)
    _write_generation_config(folder, EOS)
    settings = dict(eos_token="<|eot_id|>", processor_class="MllamaProcessor")
    _write_tokenizer(folder, TOKENS, settings, TEMPLATE, prepend_bos=False)
    write_json(folder / "processor_config.json", dict(processor_class="MllamaProcessor"))
    write_json(folder / "preprocessor_config.json", IMAGE_PROCESSOR)


ARCHS: dict[str, Callable[[Path], None]] = {"mllama": build_mllama}
