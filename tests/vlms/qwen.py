"""Tiny random-weight Qwen vision-language folders (M-RoPE: positions that depend on the image), built offline.

In the spirit of tests/tiny_vision.py (read its docstring: the demo tokenizer with the family's special tokens added
after its 2,048 ids, the model class's own initialisation under a fixed seed, float32, the hub's processor files
and chat template), for the Qwen families whose language model takes 3-D positions (time, height, width): an
image's tokens get positions from its grid, and every token after it is shifted by the prompt's `rope_delta`.

- `qwen2_vl` (Qwen/Qwen2-VL-2B-Instruct's layout), `qwen2_5_vl` (Qwen2.5-VL's, windowed vision attention),
  `qwen3_vl` (Qwen3-VL's: deepstack features added to the first text layers' hidden states at the image's tokens)
  and `qwen3_vl_moe` (its mixture-of-experts text model): a vision tower of patch 14, merge 2 (a 28x28 image is one
  token, 56x56 four, 56x84 six), hidden 32, 1-2 layers; a text model of hidden 64, 2 layers, 4 heads of 16, 2 KV
  heads, mrope_section [2, 3, 3] (head_dim / 2).
- `qwen3_5` (Qwen 3.5, which reads images natively): Qwen3-VL's tower and a hybrid text model (a gated-delta linear
  attention layer, then a full-attention one).

Added tokens (ids 2048 on): <|vision_start|>, <|vision_end|>, <|vision_pad|>, <|image_pad|>, <|video_pad|> (and
Qwen 3.5's <think>, </think>); the template is the hub's (a `{"type": "image"}` part renders
<|vision_start|><|image_pad|><|vision_end|>, which the processor expands to the image's grid / 4 pads). The
processor is mlx-vlm's own class for each family (patched into AutoProcessor) with transformers' Qwen2VLImageProcessor
(PIL, no torch). The weights keep mlx-vlm's own names and layouts (each family's `sanitize` passes them as they are).

`build_qwen2_5_vl(folder, **sizes)` builds the Qwen2.5-VL one bigger (a benchmark's model: bench/vision.py), same
layout and seed, its image processor's min/max pixels setting how many tokens an image becomes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.tiny_kinds import parameters, save_weights, seeded, write_json
from tests.tiny_vision import DEMO_IDS, DEMO_VOCAB, END, PAD, _model_config, _write_generation_config, _write_tokenizer

TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
IDS = {token: DEMO_VOCAB + i for i, token in enumerate(TOKENS)}
PATCH, MERGE, TEMPORAL = 14, 2, 2
MIN_PIXELS, MAX_PIXELS = (PATCH * MERGE) ** 2, (PATCH * MERGE * 4) ** 2  # 28x28 .. 112x112
CONTEXT = 32768
EOS = DEMO_IDS[END]

#: Qwen2-VL's and Qwen2.5-VL's template (Qwen/Qwen2.5-VL-*-Instruct)
TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Qwen3-VL's (Qwen/Qwen3-VL-*-Instruct, without its tool-calling branch): no default system turn
TEMPLATE3 = (
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{ message['content'] }}{%- else %}"
    "{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif content['type'] == 'video' or 'video' in content %}<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif 'text' in content %}{{ content['text'] }}{%- endif %}{%- endfor %}{%- endif %}{{ '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="Qwen2VLImageProcessor", do_convert_rgb=True, do_normalize=True, do_rescale=True,
    do_resize=True, image_mean=[0.48145466, 0.4578275, 0.40821073], image_std=[0.26862954, 0.26130258, 0.27577711],
    min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, size=dict(shortest_edge=MIN_PIXELS, longest_edge=MAX_PIXELS),
    patch_size=PATCH, temporal_patch_size=TEMPORAL, merge_size=MERGE, resample=3, rescale_factor=1 / 255,
)  # fmt: skip
TEXT: dict[str, Any] = dict(
    hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
    rms_norm_eps=1e-6, vocab_size=DEMO_VOCAB + len(TOKENS), max_position_embeddings=CONTEXT, rope_theta=10000.0,
    rope_scaling=dict(type="mrope", mrope_section=[2, 3, 3]), tie_word_embeddings=False, torch_dtype="float32",
)  # fmt: skip
VISION: dict[str, Any] = dict(
    depth=2, num_heads=2, patch_size=PATCH, spatial_patch_size=PATCH, spatial_merge_size=MERGE,
    temporal_patch_size=TEMPORAL, in_channels=3, torch_dtype="float32",
)  # fmt: skip
TOP: dict[str, Any] = dict(
    image_token_id=IDS["<|image_pad|>"], video_token_id=IDS["<|video_pad|>"],
    vision_start_token_id=IDS["<|vision_start|>"], vision_end_token_id=IDS["<|vision_end|>"],
    vision_token_id=IDS["<|vision_pad|>"], bos_token_id=DEMO_IDS[PAD], eos_token_id=EOS, pad_token_id=DEMO_IDS[PAD],
)  # fmt: skip

QWEN2_VL = dict(
    TEXT, **TOP, architectures=["Qwen2VLForConditionalGeneration"], model_type="qwen2_vl",
    vision_config=dict(VISION, model_type="qwen2_vl", embed_dim=32, hidden_size=TEXT["hidden_size"], mlp_ratio=2),
)  # fmt: skip
QWEN2_5_VL = dict(
    TEXT, **TOP, architectures=["Qwen2_5_VLForConditionalGeneration"], model_type="qwen2_5_vl",
    vision_config=dict(
        VISION, model_type="qwen2_5_vl", hidden_size=32, intermediate_size=64, out_hidden_size=TEXT["hidden_size"],
        window_size=PATCH * MERGE * 2, fullatt_block_indexes=[1],
    ),
)  # fmt: skip
QWEN3_TEXT: dict[str, Any] = dict(
    TEXT, head_dim=16, rope_scaling=dict(rope_type="default", mrope_section=[2, 3, 3], mrope_interleaved=True),
    attention_bias=False, hidden_act="silu",
)  # fmt: skip
QWEN3_VISION: dict[str, Any] = dict(
    VISION, hidden_size=32, intermediate_size=64, out_hidden_size=TEXT["hidden_size"], num_position_embeddings=16,
    deepstack_visual_indexes=[0], hidden_act="gelu_pytorch_tanh",
)  # fmt: skip
QWEN3_VL = dict(
    **TOP, architectures=["Qwen3VLForConditionalGeneration"], model_type="qwen3_vl", tie_word_embeddings=False,
    text_config=dict(QWEN3_TEXT, model_type="qwen3_vl_text"), vision_config=dict(QWEN3_VISION, model_type="qwen3_vl"),
)  # fmt: skip
QWEN3_VL_MOE = dict(
    **TOP, architectures=["Qwen3VLMoeForConditionalGeneration"], model_type="qwen3_vl_moe", tie_word_embeddings=False,
    text_config=dict(
        QWEN3_TEXT, model_type="qwen3_vl_moe_text", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        decoder_sparse_step=1, mlp_only_layers=[],
    ),
    vision_config=dict(QWEN3_VISION, model_type="qwen3_vl_moe"),
)  # fmt: skip
QWEN3_5 = dict(
    **TOP, architectures=["Qwen3_5ForConditionalGeneration"], model_type="qwen3_5", tie_word_embeddings=False,
    text_config=dict(
        TEXT, model_type="qwen3_5_text", head_dim=16, linear_num_value_heads=2, linear_num_key_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, full_attention_interval=2,
        eos_token_id=EOS, rope_parameters=dict(
            type="default", mrope_section=[2, 1, 1], rope_theta=10000.0, partial_rotary_factor=0.5,
            mrope_interleaved=True,
        ),
    ),
    vision_config=dict(QWEN3_VISION, model_type="qwen3_5", deepstack_visual_indexes=[]),
)  # fmt: skip


def _build(
    module: ModuleType,
    config: dict[str, Any],
    template: str,
    processor_class: str,
    image_processor: dict[str, Any] = IMAGE_PROCESSOR,
) -> Callable[[Path], None]:
    def build(folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        save_weights(folder, parameters(seeded(lambda: module.Model(_model_config(module, config)))))
        write_json(folder / "config.json", config)
        _write_generation_config(folder, EOS)
        settings = dict(
            processor_class=processor_class, image_token="<|image_pad|>", video_token="<|video_pad|>", bos_token=None
        )
        _write_tokenizer(folder, TOKENS, settings, template, prepend_bos=False)
        write_json(folder / "processor_config.json", {"processor_class": processor_class})
        write_json(folder / "preprocessor_config.json", dict(image_processor, processor_class=processor_class))

    return build


def _qwen2_vl(folder: Path) -> None:
    from mlx_vlm.models import qwen2_vl

    _build(qwen2_vl, QWEN2_VL, TEMPLATE, "Qwen2VLProcessor")(folder)


def _qwen2_5_vl(folder: Path) -> None:
    build_qwen2_5_vl(folder)


def build_qwen2_5_vl(folder: Path, **sizes: Any) -> Path:
    """Write the Qwen2.5-VL folder into `folder` (returns it): the tiny one of ARCHS, byte for byte, or with `sizes`
    a bigger one of the same layout and seed (a benchmark's model): see qwen2_5_vl_sizes."""
    from mlx_vlm.models import qwen2_5_vl

    config, image_processor = qwen2_5_vl_sizes(**sizes)
    _build(qwen2_5_vl, config, TEMPLATE, "Qwen2_5_VLProcessor", image_processor)(folder)
    return folder


#: what build_qwen2_5_vl's `sizes` may set: the text model's sizes as its config names them (mrope_section: the
#: rotary half of a head split into time, height and width), the vision tower's with a `vision_` prefix, and the
#: image processor's pixel bounds (an image is resized, keeping its aspect, to a multiple of 28x28 pixels within
#: them; each 28x28 block is one image token)
QWEN2_5_VL_TEXT_SIZES = ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                         "num_key_value_heads", "mrope_section")  # fmt: skip
QWEN2_5_VL_VISION_SIZES = ("hidden_size", "intermediate_size", "depth", "num_heads", "window_size",
                           "fullatt_block_indexes")  # fmt: skip
QWEN2_5_VL_PIXELS = ("min_pixels", "max_pixels")


def qwen2_5_vl_sizes(**sizes: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Qwen2.5-VL's config.json and preprocessor_config.json with `sizes` over QWEN2_5_VL's (none: QWEN2_5_VL and
    IMAGE_PROCESSOR themselves): e.g. `hidden_size=256, num_attention_heads=4, mrope_section=[8, 12, 12],
    vision_hidden_size=128, vision_depth=4, max_pixels=72 * 28 * 28`. The tower's out_hidden_size follows the text
    model's hidden_size; mrope_section must add up to half a head (hidden_size / num_attention_heads / 2)."""
    if not sizes:
        return QWEN2_5_VL, IMAGE_PROCESSOR
    text = {k: sizes.pop(k) for k in QWEN2_5_VL_TEXT_SIZES if k in sizes}
    vision = {k: sizes.pop(f"vision_{k}") for k in QWEN2_5_VL_VISION_SIZES if f"vision_{k}" in sizes}
    pixels = {k: sizes.pop(k) for k in QWEN2_5_VL_PIXELS if k in sizes}
    if sizes:
        raise ValueError(
            f"unknown Qwen2.5-VL sizes {sorted(sizes)}: text {QWEN2_5_VL_TEXT_SIZES}, vision_* "
            f"{QWEN2_5_VL_VISION_SIZES}, {QWEN2_5_VL_PIXELS}"
        )
    section = text.pop("mrope_section", TEXT["rope_scaling"]["mrope_section"])
    config = dict(QWEN2_5_VL, **text, rope_scaling=dict(type="mrope", mrope_section=list(section)))
    head = config["hidden_size"] // config["num_attention_heads"]
    if sum(section) * 2 != head:
        raise ValueError(f"mrope_section {section} must add up to half a head ({head} // 2)")
    config["vision_config"] = dict(QWEN2_5_VL["vision_config"], **vision, out_hidden_size=config["hidden_size"])
    lowest, highest = pixels.get("min_pixels", MIN_PIXELS), pixels.get("max_pixels", MAX_PIXELS)
    if not MIN_PIXELS <= lowest <= highest:
        raise ValueError(f"min_pixels {lowest}, max_pixels {highest}: need {MIN_PIXELS} <= min_pixels <= max_pixels")
    image_processor = dict(
        IMAGE_PROCESSOR, min_pixels=lowest, max_pixels=highest, size=dict(shortest_edge=lowest, longest_edge=highest)
    )
    return config, image_processor


def _qwen3_vl(folder: Path) -> None:
    from mlx_vlm.models import qwen3_vl

    _build(qwen3_vl, QWEN3_VL, TEMPLATE3, "Qwen3VLProcessor")(folder)


def _qwen3_vl_moe(folder: Path) -> None:
    from mlx_vlm.models import qwen3_vl_moe

    _build(qwen3_vl_moe, QWEN3_VL_MOE, TEMPLATE3, "Qwen3VLProcessor")(folder)


def _qwen3_5(folder: Path) -> None:
    from mlx_vlm.models import qwen3_5

    _build(qwen3_5, QWEN3_5, TEMPLATE3, "Qwen3VLProcessor")(folder)


ARCHS: dict[str, Callable[[Path], None]] = {
    "qwen2_vl": _qwen2_vl,
    "qwen2_5_vl": _qwen2_5_vl,
    "qwen3_vl": _qwen3_vl,
    "qwen3_vl_moe": _qwen3_vl_moe,
    "qwen3_5": _qwen3_5,
}
