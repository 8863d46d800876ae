"""A tiny LFM2-VL (`lfm2_vl`, as LiquidAI/LFM2-VL-450M ships it): a SigLIP 2 NaFlex tower (8x8 patches, its position
embeddings a 4x4 grid resized to each image's, hidden 32, 2 layers), the projector's pixel unshuffle (factor 2) and
two-layer MLP, and an LFM2 text model (hidden 64: a short-convolution layer, then an attention layer). mlx-vlm's
processor (transformers' Lfm2VlProcessor over its NumPy image processor) resizes an image to whole 16-pixel blocks
within 4 to 16 image tokens, keeping its aspect ratio (tiles of 32 px past that), so images of other shapes give
prompts of other lengths: <|image_start|>, the image's <image> tokens, <|image_end|>. Added tokens: <image> 2048,
<|image_start|>, <|image_end|>, <|img_thumbnail|>, and the tiles' <|img_row_R_col_C|> up to 3x3; ChatML's
<|im_start|>, <|im_end|> are the demo tokenizer's own (<|im_end|> ends an answer). Keys as the hub's:
`model.vision_tower.*`, `model.multi_modal_projector.*`, `model.language_model.*`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, END, Family, added_ids, write_folder

TILES = [f"<|img_row_{r}_col_{c}|>" for r in range(1, 4) for c in range(1, 4)]
TOKENS = ["<image>", "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>", *TILES]
IDS = added_ids(TOKENS)
PATCH, TILE = 8, 32
TEXT: dict[str, Any] = dict(
    model_type="lfm2", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=2, num_heads=4, max_position_embeddings=1024, rope_theta=1000000.0,
    vocab_size=DEMO_VOCAB + len(TOKENS), eos_token_id=DEMO_IDS[END], norm_eps=1e-5, block_dim=64,
    block_ff_dim=128, block_auto_adjust_ff_dim=False, block_multiple_of=8, conv_L_cache=3, conv_bias=False,
    conv_dim=64, conv_dim_out=64, layer_types=["conv", "full_attention"], tie_word_embeddings=True,
    torch_dtype="float32",
)  # fmt: skip
LIMITS: dict[str, Any] = dict(
    downsample_factor=2, encoder_patch_size=PATCH, max_image_tokens=16, min_image_tokens=4, tile_size=TILE,
    max_tiles=4, min_tiles=2, use_thumbnail=True, do_image_splitting=True, max_pixels_tolerance=2.0,
    use_image_special_tokens=True,
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["Lfm2VlForConditionalGeneration"], model_type="lfm2_vl", text_config=TEXT,
    vision_config=dict(
        model_type="siglip2_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_channels=3, image_size=TILE, patch_size=PATCH, num_patches=16,
        layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh", vision_use_head=False,
    ),
    image_token_id=IDS["<image>"], max_num_patches=64, projector_hidden_size=64, projector_bias=True,
    projector_hidden_act="gelu", projector_use_layernorm=True, vision_feature_layer=-1, eos_token_id=DEMO_IDS[END],
    torch_dtype="float32", **LIMITS,
)  # fmt: skip
#: LFM2-VL's template (ChatML, an image part as <image>)
TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' %}{{ '<image>' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="Lfm2VlImageProcessor", processor_class="Lfm2VlProcessor", do_normalize=True,
    do_rescale=True, do_resize=True, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], resample=2,
    rescale_factor=1 / 255, max_num_patches=64, **LIMITS,
)  # fmt: skip


def _hub_key(name: str) -> str:
    if name.startswith("language_model.model."):
        return "model.language_model." + name.removeprefix("language_model.model.")
    return "model." + name


def build_lfm2_vl(folder: Path) -> Path:
    """A tiny LFM2-VL (LFM2-VL-450M's layout)."""
    return write_folder(
        folder,
        Family(
            module="lfm2_vl",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=DEMO_IDS[END],
            tokenizer=dict(processor_class="Lfm2VlProcessor"),
            processor=dict(processor_class="Lfm2VlProcessor", use_image_special_tokens=True),
            image_processor=IMAGE_PROCESSOR,
            prepend_bos=False,
            hub_key=_hub_key,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"lfm2_vl": build_lfm2_vl}
