"""A tiny MiniCPM-V 4.6 (`minicpmv4_6`, as openbmb/MiniCPM-V-4_6 ships it): a SigLIP-style tower (14x14 patches, hidden
32, 2 layers), its ViT merger (2x2 windows, after layer 0) and the 2x2 merger into the text model's width: an image
of 56x56 pixels becomes 1 token per 16 patches; and Qwen 3.5's hybrid text model (hidden 64, 2 layers: a gated-delta
linear layer, then full attention; mlx-vlm gives it plain positions, not M-RoPE from the image). mlx-vlm's
MiniCPMVProcessor slices an image (up to 2 slices beside the whole, scale_resolution 56) and writes
`<image_id>0</image_id><image>` + its <|image_pad|> tokens + `</image>`, then each slice's `<slice>…</slice>`; it
gives the model where each image's features go (`image_bound`, the spans between the <image>/<slice> tokens) and
each slice's pixels as their own array (`pixel_values`, a list of arrays of different sizes). Its config names no
image token. Added tokens: <image> 2048, </image>, <slice>, </slice>, <image_id>, </image_id>, <unk>,
<|image_pad|>, <|video_pad|>; <|im_end|> ends an answer. The template is Qwen's ChatML, an image part rendering
`<image>./</image>` as MiniCPM-V's does. Keys as the hub's: `model.language_model.*`, `model.vision_tower.*`,
`model.merger.*`, `lm_head.*`.

MiniCPM-o 2.6 (`minicpmo`, as openbmb/MiniCPM-o-2_6 ships it) reads images the same way, through a SigLIP tower
(hidden 32, 2 layers) and its perceiver resampler (4 queries an image or slice: the hub's 64, drawn from a seeded
normal, not mlx-vlm's zeros), into a Qwen-style text model (hidden 64, 2 layers; mlx-vlm's Qwen3-VL language model,
plain positions); its audio tower and TTS are not built (init_audio, init_tts false: an image-only folder). Its
MiniCPMOProcessor writes each image as <image>, 4 <unk>, </image> (the slices as the whole) and gives the same
`image_bound` and per-slice pixels. Added tokens: MiniCPM-V's, and <|listen|> (its processor drops that token's
id from every prompt: without it, unk's, the image's own). Keys as the hub's: `llm.*`, `vpm.*`, `resampler.*`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, END, Family, added_ids, write_folder

TOKENS = ["<image>", "</image>", "<slice>", "</slice>", "<image_id>", "</image_id>", "<unk>", "<|image_pad|>",
          "<|video_pad|>"]  # fmt: skip
IDS = added_ids(TOKENS)
EOS = DEMO_IDS[END]
PATCH, SCALE = 14, 56
TEXT: dict[str, Any] = dict(
    model_type="qwen3_5_text", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, vocab_size=DEMO_VOCAB + len(TOKENS),
    linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4, full_attention_interval=2, max_position_embeddings=4096, tie_word_embeddings=False,
    rope_parameters=dict(type="default", mrope_section=[2, 1, 1], rope_theta=10000.0, partial_rotary_factor=0.5),
)  # fmt: skip
VISION: dict[str, Any] = dict(
    model_type="siglip", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
    image_size=SCALE, patch_size=PATCH, layer_norm_eps=1e-6,
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["MiniCPMV4_6ForConditionalGeneration"], model_type="minicpmv4_6", text_config=TEXT,
    vision_config=VISION, query_num=1, image_size=SCALE, patch_size=PATCH, insert_layer_id=0,
    slice_config=dict(model_type="minicpmv4_6", patch_size=PATCH, max_slice_nums=2, scale_resolution=SCALE),
    downsample_mode="16x", merge_kernel_size=[2, 2], merger_times=1, eos_token_id=[EOS], torch_dtype="float32",
)  # fmt: skip
#: ChatML (Qwen 3.5's turns), an image part written as MiniCPM-V's template writes it
TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}"
    "{{ '<image>./</image>\n' }}{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="MiniCPMVImageProcessor", processor_class="MiniCPMVProcessor", max_slice_nums=2,
    patch_size=PATCH, scale_resolution=SCALE, image_feature_size=1, slice_mode=True, use_image_id=True,
    downsample_mode="16x", norm_mean=[0.5, 0.5, 0.5], norm_std=[0.5, 0.5, 0.5],
)  # fmt: skip


def _hub_key(name: str) -> str:
    if name.startswith("language_model.lm_head"):
        return name.removeprefix("language_model.")
    return "model." + name.replace("language_model.model.", "language_model.")


def build_minicpmv4_6(folder: Path) -> Path:
    """A tiny MiniCPM-V 4.6 (see the module's docstring)."""
    return write_folder(
        folder,
        Family(
            module="minicpmv4_6",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=EOS,
            tokenizer=dict(processor_class="MiniCPMVProcessor", unk_token="<unk>"),
            processor=dict(processor_class="MiniCPMVProcessor"),
            image_processor=IMAGE_PROCESSOR,
            prepend_bos=False,
            hub_key=_hub_key,
        ),
    )


O_TOKENS = [*TOKENS, "<|listen|>"]  # (its processor drops every id its <|listen|> has: unk's, were it missing)
O_TEXT: dict[str, Any] = dict(
    model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, vocab_size=DEMO_VOCAB + len(O_TOKENS), rope_theta=10000.0,
    max_position_embeddings=4096, tie_word_embeddings=False, attention_bias=True,
    rope_scaling=dict(type="default", mrope_section=[2, 3, 3]),
)  # fmt: skip
O_CONFIG: dict[str, Any] = dict(
    architectures=["MiniCPMO"], model_type="minicpmo", text_config=O_TEXT,
    vision_config=dict(VISION, model_type="siglip_vision_model"), query_num=4, image_size=SCALE, patch_size=PATCH,
    init_vision=True, init_audio=False, init_tts=False, slice_mode=True,
    slice_config=dict(model_type="minicpmv", patch_size=PATCH, max_slice_nums=2, scale_resolution=SCALE),
    eos_token_id=[EOS], torch_dtype="float32",
)  # fmt: skip
O_IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="MiniCPMOImageProcessor", processor_class="MiniCPMOProcessor", patch_size=PATCH,
    scale_resolution=SCALE, image_feature_size=4, norm_mean=[0.5, 0.5, 0.5], norm_std=[0.5, 0.5, 0.5],
)  # fmt: skip


def _o_hub_key(name: str) -> str:
    return name.replace("language_model.", "llm.", 1).replace("vision_tower.", "vpm.", 1)


def _o_queries(weights: dict[str, Any]) -> None:
    """The resampler's queries drawn from a seeded normal (mlx-vlm's are zeros, a placeholder for the hub's)."""
    import mlx.core as mx

    shape = weights["resampler.query"].shape
    weights["resampler.query"] = mx.random.normal(shape, key=mx.random.key(11)) * shape[1] ** -0.5


def build_minicpmo(folder: Path) -> Path:
    """A tiny MiniCPM-o 2.6, images only (see the module's docstring)."""
    return write_folder(
        folder,
        Family(
            module="minicpmo",
            config=O_CONFIG,
            tokens=O_TOKENS,
            template=TEMPLATE,
            eos=EOS,
            tokenizer=dict(processor_class="MiniCPMOProcessor", unk_token="<unk>"),
            processor=dict(processor_class="MiniCPMOProcessor"),
            image_processor=O_IMAGE_PROCESSOR,
            prepend_bos=False,
            hub_key=_o_hub_key,
            weights=_o_queries,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"minicpmv4_6": build_minicpmv4_6, "minicpmo": build_minicpmo}
