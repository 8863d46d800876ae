"""A tiny dots.ocr (`dots_ocr`, as rednote-hilab/dots.ocr ships it): its NaViT tower (patch 14, width 32, 2 layers,
RMS norms) whose merger turns 2x2 patches into an image token of the text model's width, and a Qwen2 text model
(hidden 64, 2 layers, 4 query heads and 2 KV heads, ordinary 1-D positions) whose config is config.json's top
level, as the hub's. mlx-vlm's DotsVLProcessor is Qwen2.5-VL's with dots' image token <|imgpad|> and transformers'
Qwen2VLImageProcessor (28x28 to 112x112 pixels here: an image is 1 to 16 tokens). Added tokens, at the hub's ids (tests/vlms/hub_ids.py: the
processor counts <|imgpad|> as 151665): <|imgpad|>, <|img|>, <|endofimg|>, <|video_pad|> 151656, <|system|>,
<|endofsystem|>, <|user|>, <|endofuser|>, <|assistant|>, <|endofassistant|> (its answers' end); embeddings tied; the template is the hub's (an image part <|img|><|imgpad|><|endofimg|>, each
text part a user turn). Keys as the hub names them (`model.*`, `vision_tower.*`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.tiny_vision import PAD
from tests.vlms.folder import DEMO_IDS, Family, write_folder
from tests.vlms.hub_ids import place
from tests.vlms.qwen import IMAGE_PROCESSOR

TOKENS = [
    "<|imgpad|>", "<|img|>", "<|endofimg|>", "<|video_pad|>", "<|system|>", "<|endofsystem|>", "<|user|>",
    "<|endofuser|>", "<|assistant|>", "<|endofassistant|>",
]  # fmt: skip
#: mlx-vlm's DotsVLProcessor counts <|imgpad|> by the hub's id, so the tokens sit at the hub's ids
IDS = dict(zip(TOKENS, [151665, 151666, 151667, 151656, 151668, 151669, 151670, 151671, 151672, 151673]))
VOCAB = 151936
EOS = IDS["<|endofassistant|>"]
#: dots.ocr's template (rednote-hilab/dots.ocr)
TEMPLATE = (
    "{%- for m in messages %}{%- if m.role == 'system' %}{{- '<|system|>' + m.content + '<|endofsystem|>\\n' }}"
    "{%- elif m.role == 'user' %}{% if m.content is string %}{{- '<|user|>' + m.content + '<|endofuser|>' }}"
    "{% else %}{% for content in m.content %}{% if content.type == 'image' %}{{ '<|img|><|imgpad|><|endofimg|>' }}"
    "{% else %}{{ '<|user|>' + content.text + '<|endofuser|>' }}{% endif %}{% endfor %}{% endif %}"
    "{%- elif m.role == 'assistant' %}{{- '<|assistant|>' + m.content }}{%- if not loop.last %}"
    "{{- '<|endofassistant|>' }}{%- endif %}{%- endif %}{%- endfor %}"
    "{%- if messages[-1].role != 'assistant' %}{{- '<|assistant|>' }}{%- endif %}"
)
CONFIG: dict[str, Any] = dict(
    architectures=["DotsOCRForCausalLM"], model_type="dots_ocr", hidden_size=64, intermediate_size=128,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
    rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=True, tie_word_embeddings=True, vocab_size=VOCAB,
    image_token_id=IDS["<|imgpad|>"], video_token_id=IDS["<|video_pad|>"],
    bos_token_id=DEMO_IDS[PAD], eos_token_id=EOS, pad_token_id=DEMO_IDS[PAD],
    vision_config=dict(
        model_type="dots_vit", embed_dim=32, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_channels=3, patch_size=14, post_norm=True, rms_norm_eps=1e-5,
        spatial_merge_size=2, temporal_patch_size=1, use_bias=False,
    ),
    torch_dtype="float32",
)  # fmt: skip


def hub_key(name: str) -> str:
    """A dots.ocr weight as the hub names it."""
    if name.startswith("language_model.model.lm_head."):
        return name.removeprefix("language_model.model.")
    return name.replace("language_model.model.", "model.", 1)


def build_dots_ocr(folder: Path) -> Path:
    """A tiny dots.ocr (see the module's docstring)."""
    processor = "DotsVLProcessor"
    settings = dict(processor_class=processor, image_token="<|imgpad|>", video_token="<|video_pad|>", bos_token=None)
    write_folder(
        folder,
        Family(
            module="dots_ocr", config=CONFIG, tokens=TOKENS, template=TEMPLATE, eos=EOS, tokenizer=settings,
            processor=dict(processor_class=processor),
            image_processor=dict(IMAGE_PROCESSOR, temporal_patch_size=1, processor_class=processor),
            prepend_bos=False, hub_key=hub_key,
        ),
    )  # fmt: skip
    place(folder, IDS, VOCAB)
    return folder


ARCHS: dict[str, Callable[[Path], Path]] = {"dots_ocr": build_dots_ocr}
