"""A tiny Granite Vision (`granite_vision`, as ibm-granite/granite-vision-3.2-2b ships it, under mlx-vlm's model_type
for it): LLaVA-NeXT's layout with a SigLIP tower (32x32 tiles, 8x8 patches, hidden 32, 2 layers, its features from
the last layer), the two-layer projector, an image_newline and a Granite text model (hidden 64, 2 layers; its muP
multipliers 1, but attention's 1/sqrt(head_dim): the hub's, with tied random embeddings, make every answer the
prompt's last token). The processor is mlx-vlm's GraniteVisionProcessor over transformers' LlavaNextImageProcessor (anyres:
the best of the 32x32 to 64x64 pinpoints for the image's shape, then the 32x32 base image), which writes as many
<image> tokens as its unpadded features. Added tokens: <|start_of_role|> 2048, <|end_of_role|>, <|end_of_text|> (its
answers' end), <image>. Keys as the hub's: `language_model.model.*`, `vision_tower.vision_model.*`,
`multi_modal_projector.*`, `image_newline`, no lm_head (tied).

Granite 4 Vision (`granite4_vision`, as ibm-granite/granite-4.0-3b-vision ships it) is the same anyres tiling (64x64
tiles of 8x8 patches, pinpoints to 128x128) over a SigLIP tower of hidden 64 (its QFormer projectors take a head per
64 of it), 2 layers; its window-QFormer projectors ("4/8": each 8x8 window of patches read by 4x4 queries) give a
tile 16 tokens: one projector's features replace the <image> tokens' embeddings, and each projector's (a deepstack
one and four spatial ones, each a corner of every 2x2 patches) are added to the hidden states of the text layer
`deepstack_layer_map` / `spatial_target_layers` names, at the image's tokens (`deepstack_visual_embeds`, the whole
prompt long, and `visual_pos_masks`). Its text model is Granite's (hidden 64, 2 layers, tied). Keys as the hub's:
`model.language_model.*`, `model.vision_tower.*`, `model.layerwise_projectors.*`, `model.spatial_projectors.*`,
`model.image_newline`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, Family, added_ids, write_folder

TOKENS = ["<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<image>"]
IDS = added_ids(TOKENS)
EOS = IDS["<|end_of_text|>"]
TILE, PATCH = 32, 8
PINPOINTS = [[32, 32], [32, 64], [64, 32], [64, 64]]
TEXT: dict[str, Any] = dict(
    model_type="granite", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=DEMO_VOCAB + len(TOKENS), rope_theta=300000.0,
    max_position_embeddings=1024, tie_word_embeddings=True, embedding_multiplier=1.0,
    attention_multiplier=0.25, residual_multiplier=1.0, logits_scaling=1.0, torch_dtype="float32",
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["LlavaNextForConditionalGeneration"], model_type="granite_vision", text_config=TEXT,
    vision_config=dict(
        model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, image_size=TILE, patch_size=PATCH, num_channels=3, layer_norm_eps=1e-6,
    ),
    image_token_index=IDS["<image>"], vision_feature_select_strategy="full", vision_feature_layer=-1,
    image_grid_pinpoints=PINPOINTS, vocab_size=TEXT["vocab_size"], projector_hidden_act="gelu",
    tie_word_embeddings=True, eos_token_id=EOS, pad_token_id=DEMO_IDS["<|endoftext|>"], torch_dtype="float32",
)  # fmt: skip
#: Granite 3.2's template's turns (without its default system prompt)
TEMPLATE = (
    "{% for message in messages %}{{ '<|start_of_role|>' + message['role'] + '<|end_of_role|>' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}{{ '<image>\n' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|end_of_text|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_of_role|>assistant<|end_of_role|>' }}{% endif %}"
)
IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="LlavaNextImageProcessor", processor_class="LlavaNextProcessor", do_center_crop=True,
    do_convert_rgb=True, do_normalize=True, do_pad=True, do_rescale=True, do_resize=True,
    crop_size=dict(height=TILE, width=TILE), image_grid_pinpoints=PINPOINTS, image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5], resample=3, rescale_factor=1 / 255, size=dict(shortest_edge=TILE),
)  # fmt: skip
PROCESSOR: dict[str, Any] = dict(
    processor_class="LlavaNextProcessor", patch_size=PATCH, vision_feature_select_strategy="full",
    image_token="<image>", num_additional_image_tokens=0,
)  # fmt: skip


def build_granite_vision(folder: Path) -> Path:
    """A tiny Granite Vision (granite-vision-3.2-2b's layout)."""
    return write_folder(
        folder,
        Family(
            module="granite_vision",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=EOS,
            tokenizer=dict(eos_token="<|end_of_text|>", processor_class="LlavaNextProcessor"),
            processor=PROCESSOR,
            image_processor=IMAGE_PROCESSOR,
            prepend_bos=False,
            hub_key=lambda name: None if name == "language_model.lm_head.weight" else name,
        ),
    )


G4_TILE = 64
G4_PINPOINTS = [[64, 64], [64, 128], [128, 64], [128, 128]]
G4_CONFIG: dict[str, Any] = dict(
    CONFIG, architectures=["Granite4VisionForConditionalGeneration"], model_type="granite4_vision",
    text_config=dict(TEXT, model_type="granitemoehybrid"),
    vision_config=dict(CONFIG["vision_config"], hidden_size=64, intermediate_size=128, image_size=G4_TILE),
    image_grid_pinpoints=G4_PINPOINTS, downsample_rate="4/8", deepstack_layer_map=[[-1, 0]],
    use_spatial_sampling=True, spatial_stride=2, spatial_vision_layer=-1, spatial_target_layers=[1],
    use_image_newline_parameter=True,
)  # fmt: skip
G4_IMAGE_PROCESSOR: dict[str, Any] = dict(
    IMAGE_PROCESSOR, crop_size=dict(height=G4_TILE, width=G4_TILE), size=dict(shortest_edge=G4_TILE),
    image_grid_pinpoints=G4_PINPOINTS, processor_class="Granite4VisionProcessor",
)  # fmt: skip


def _granite4_hub_key(name: str) -> str | None:
    if name == "language_model.lm_head.weight":
        return None
    return "model." + name.replace("language_model.model.", "language_model.")


def build_granite4_vision(folder: Path) -> Path:
    """A tiny Granite 4 Vision (granite-4.0-3b-vision's layout)."""
    return write_folder(
        folder,
        Family(
            module="granite4_vision",
            config=G4_CONFIG,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=EOS,
            tokenizer=dict(eos_token="<|end_of_text|>", processor_class="Granite4VisionProcessor"),
            processor=dict(PROCESSOR, processor_class="Granite4VisionProcessor", downsample_rate="4/8"),
            image_processor=G4_IMAGE_PROCESSOR,
            prepend_bos=False,
            hub_key=_granite4_hub_key,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {
    "granite_vision": build_granite_vision,
    "granite4_vision": build_granite4_vision,
}
