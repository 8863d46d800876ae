"""Tiny Mistral 3 (`mistral3`, as mistralai/Mistral-Small-3.1-24B-Instruct-2503 ships it) and Pixtral (`pixtral`,
as mistral-community/pixtral-12b ships it) folders: a Pixtral vision tower (2-D RoPE, 32x32 images in 8x8 patches,
hidden 32, 2 layers) and a Mistral text model (hidden 64, 2 layers, 4 query heads, 2 KV heads of 16). Mistral 3's
projector merges 2x2 patches (spatial_merge_size 2: a 32x32 image is 2x2 image tokens), Pixtral's reads every patch
(4x4). Both processors (mlx-vlm's own, over its PixtralImageProcessor) resize an image to at most 32 px on its
longest edge, in whole patches, so images of other shapes give other counts of tokens, each row of [IMG] ended by
[IMG_BREAK], the last by [IMG_END]. Added tokens: [INST] 2048, [/INST] 2049, [IMG] 2050, [IMG_BREAK] 2051,
[IMG_END] 2052; the tokenizer prepends <|im_start|> as Mistral's prepends <s>, and <|im_end|> ends an answer as
</s>. The hub keys: `vision_tower.*` (mlx-vlm's `vision_tower.vision_model.*`), `language_model.*`,
`multi_modal_projector.*`; the patch convolution in torch's layout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, END, START, Family, added_ids, write_folder

TOKENS = ["[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"]
IDS = added_ids(TOKENS)
IMAGE_SIZE, PATCH = 32, 8
TEXT: dict[str, Any] = dict(
    model_type="mistral", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, vocab_size=DEMO_VOCAB + len(TOKENS),
    rope_theta=1000000.0, max_position_embeddings=1024, tie_word_embeddings=False, sliding_window=None,
    torch_dtype="float32",
)  # fmt: skip
VISION: dict[str, Any] = dict(
    model_type="pixtral", hidden_size=32, num_hidden_layers=2, intermediate_size=64, num_attention_heads=2,
    head_dim=16, image_size=IMAGE_SIZE, patch_size=PATCH, num_channels=3, rope_theta=10000.0, hidden_act="silu",
    torch_dtype="float32",
)  # fmt: skip
#: the Pixtral / Mistral Small 3.1 template's user and assistant turns (no default system prompt)
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST]' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for chunk in message['content'] %}"
    "{% if chunk['type'] == 'text' %}{{ chunk['text'] }}{% elif chunk['type'] == 'image' %}{{ '[IMG]' }}{% endif %}"
    "{% endfor %}{% endif %}{{ '[/INST]' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for chunk in message['content'] %}{{ chunk['text'] }}{% endfor %}{% endif %}{{ eos_token }}"
    "{% endif %}{% endfor %}"
)
IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="PixtralImageProcessor", do_convert_rgb=True, do_normalize=True, do_rescale=True,
    do_resize=True, image_mean=[0.48145466, 0.4578275, 0.40821073], image_std=[0.26862954, 0.26130258, 0.27577711],
    patch_size=dict(height=PATCH, width=PATCH), resample=3, rescale_factor=1 / 255,
    size=dict(longest_edge=IMAGE_SIZE),
)  # fmt: skip
NAMED = dict(image_token="[IMG]", image_break_token="[IMG_BREAK]", image_end_token="[IMG_END]")


def _hub_key(name: str) -> str:
    return name.replace("vision_tower.vision_model.", "vision_tower.")


def _family(model_type: str, architecture: str, merge: int, processor_class: str) -> Family:
    config = dict(
        architectures=[architecture], model_type=model_type, text_config=TEXT, vision_config=VISION,
        image_token_index=IDS["[IMG]"], vocab_size=TEXT["vocab_size"], vision_feature_layer=-1,
        projector_hidden_act="gelu", multimodal_projector_bias=False, spatial_merge_size=merge,
        bos_token_id=DEMO_IDS[START], eos_token_id=DEMO_IDS[END], torch_dtype="float32",
    )  # fmt: skip
    processor = dict(NAMED, patch_size=PATCH, spatial_merge_size=merge, processor_class=processor_class)
    return Family(
        module=model_type,
        config=config,
        tokens=TOKENS,
        template=TEMPLATE,
        eos=DEMO_IDS[END],
        tokenizer=dict(processor_class=processor_class),
        processor=processor,
        image_processor=dict(IMAGE_PROCESSOR, processor_class=processor_class),
        hub_key=_hub_key,
    )


def build_mistral3(folder: Path) -> Path:
    """A tiny Mistral 3 (Mistral Small 3.1's layout: 2x2 patches merged into one image token)."""
    return write_folder(folder, _family("mistral3", "Mistral3ForConditionalGeneration", 2, "PixtralProcessor"))


def build_pixtral(folder: Path) -> Path:
    """A tiny Pixtral (pixtral-12b's layout: an image token a patch)."""
    return write_folder(folder, _family("pixtral", "LlavaForConditionalGeneration", 1, "PixtralProcessor"))


ARCHS: dict[str, Callable[[Path], Path]] = {"mistral3": build_mistral3, "pixtral": build_pixtral}
