"""A tiny Aya Vision (`aya_vision`, as CohereLabs/aya-vision-8b ships it): a SigLIP tower (32x32 tiles, 8x8
patches, hidden 32, 2 layers), the projector's pixel shuffle (downsample_factor 2: a tile is 2x2 image tokens) and
SwiGLU alignment, and a Cohere 2 text model (hidden 64, 2 layers, 4 query heads, 2 KV heads of 16, sliding window
16 on every other layer, logits scaled by 1/16, tied embeddings). The processor is transformers' AyaVisionProcessor
(patched by mlx-vlm) over the GotOcr2 image processor, which reads an image as one 32x32 tile (crop_to_patches
off): <image> becomes <|START_OF_IMG|>, TILE_GLOBAL, 4 <|IMG_PATCH|>, <|END_OF_IMG|>. Added tokens: the Cohere
turn tokens (<|START_OF_TURN_TOKEN|> 2048, <|END_OF_TURN_TOKEN|> 2049, its answers' end, <|USER_TOKEN|>,
<|CHATBOT_TOKEN|>, <|SYSTEM_TOKEN|>) and the image's (<|START_OF_IMG|>, <|END_OF_IMG|>, <|IMG_PATCH|> 2055: the
image token, <|IMG_LINE_BREAK|>); the tokenizer prepends <|im_start|> as Cohere's prepends <BOS_TOKEN>. Keys as the
first hub checkpoint's: `vision_tower.vision_model.*`, `multi_modal_projector.*`, `language_model.model.*`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, START, Family, added_ids, write_folder

TOKENS = [
    "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>", "<|SYSTEM_TOKEN|>",
    "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>", "<|IMG_LINE_BREAK|>",
]  # fmt: skip
IDS = added_ids(TOKENS)
IMAGE_SIZE, PATCH, DOWNSAMPLE = 32, 8, 2
EOS = IDS["<|END_OF_TURN_TOKEN|>"]
TEXT: dict[str, Any] = dict(
    model_type="cohere2", hidden_size=64, head_dim=16, num_hidden_layers=2, intermediate_size=128,
    num_attention_heads=4, num_key_value_heads=2, rope_theta=50000.0, vocab_size=DEMO_VOCAB + len(TOKENS),
    layer_norm_eps=1e-5, logit_scale=0.0625, attention_bias=False, layer_norm_bias=False, sliding_window=16,
    sliding_window_pattern=2, max_position_embeddings=1024, tie_word_embeddings=True, torch_dtype="float32",
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["AyaVisionForConditionalGeneration"], model_type="aya_vision", text_config=TEXT,
    vision_config=dict(
        model_type="siglip_vision_model", hidden_size=32, num_attention_heads=2, patch_size=PATCH,
        num_hidden_layers=2, intermediate_size=64, image_size=IMAGE_SIZE, num_channels=3, layer_norm_eps=1e-6,
        vision_use_head=False,
    ),
    image_token_index=IDS["<|IMG_PATCH|>"], downsample_factor=DOWNSAMPLE, alignment_intermediate_size=128,
    adapter_layer_norm_eps=1e-6, vision_feature_layer=-1, vision_feature_select_strategy="full",
    bos_token_id=DEMO_IDS[START], eos_token_id=EOS, pad_token_id=DEMO_IDS["<|endoftext|>"], torch_dtype="float32",
)  # fmt: skip
#: aya-vision-8b's template's turns (without its default preamble)
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|START_OF_TURN_TOKEN|>' }}"
    "{% if message['role'] == 'user' %}{{ '<|USER_TOKEN|>' }}{% elif message['role'] == 'system' %}"
    "{{ '<|SYSTEM_TOKEN|>' }}{% else %}{{ '<|CHATBOT_TOKEN|>' }}{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}{{ '<image>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|END_OF_TURN_TOKEN|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{% endif %}"
)
IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="GotOcr2ImageProcessor", processor_class="AyaVisionProcessor", crop_to_patches=False,
    do_convert_rgb=True, do_normalize=True, do_rescale=True, do_resize=True, image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5], max_patches=12, min_patches=1, resample=3, rescale_factor=1 / 255,
    size=dict(height=IMAGE_SIZE, width=IMAGE_SIZE),
)  # fmt: skip
PROCESSOR: dict[str, Any] = dict(
    processor_class="AyaVisionProcessor", patch_size=PATCH, img_size=IMAGE_SIZE, downsample_factor=DOWNSAMPLE,
    image_token="<image>", start_of_img_token="<|START_OF_IMG|>", end_of_img_token="<|END_OF_IMG|>",
    img_patch_token="<|IMG_PATCH|>", img_line_break_token="<|IMG_LINE_BREAK|>", tile_token="TILE",
    tile_global_token="TILE_GLOBAL",
)  # fmt: skip


def build_aya_vision(folder: Path) -> Path:
    """A tiny Aya Vision (aya-vision-8b's layout)."""
    return write_folder(
        folder,
        Family(
            module="aya_vision",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=EOS,
            tokenizer=dict(eos_token="<|END_OF_TURN_TOKEN|>", processor_class="AyaVisionProcessor"),
            processor=PROCESSOR,
            image_processor=IMAGE_PROCESSOR,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"aya_vision": build_aya_vision}
