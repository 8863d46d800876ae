"""A tiny LLaVA-OneVision (`llava_onevision`, as llava-hf/llava-onevision-qwen2-0.5b-ov-hf ships it): a SigLIP tower
(32x32 tiles, 8x8 patches: 16 features a tile, hidden 32, 2 layers), the two-layer projector, and a Qwen 2 text model
(hidden 64, 2 layers, 4 query heads, 2 KV heads). Images are read "anyres": the PIL image processor
(LlavaOnevisionImageProcessorPil) picks the best of the grid pinpoints (32x32 to 64x64) for an image's shape, and
mlx-vlm's processor writes as many <image> tokens as the model's features of it (its tiles unpadded to the image's
aspect ratio, a newline feature a row, then the 32x32 base image's 16): images of other shapes give prompts of other
lengths. Added tokens: <image> 2048, <video> 2049; ChatML's <|im_start|>, <|im_end|> are the demo tokenizer's own
(<|im_end|> ends an answer), and there is no BOS, as Qwen 2's. Keys as the hub's: `language_model.model.*`,
`language_model.lm_head.*`, `vision_tower.*`, `multi_modal_projector.*`, `image_newline`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, END, Family, added_ids, write_folder

TOKENS = ["<image>", "<video>"]
IDS = added_ids(TOKENS)
TILE, PATCH = 32, 8
PINPOINTS = [[32, 32], [32, 64], [64, 32], [64, 64]]
TEXT: dict[str, Any] = dict(
    model_type="qwen2", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=DEMO_VOCAB + len(TOKENS), rope_theta=1000000.0,
    max_position_embeddings=1024, tie_word_embeddings=False, torch_dtype="float32",
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["LlavaOnevisionForConditionalGeneration"], model_type="llava_onevision", text_config=TEXT,
    vision_config=dict(
        model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, image_size=TILE, patch_size=PATCH, num_channels=3, layer_norm_eps=1e-6,
        vision_use_head=False,
    ),
    image_token_index=IDS["<image>"], video_token_index=IDS["<video>"], image_grid_pinpoints=PINPOINTS,
    vision_aspect_ratio="anyres_max_9", vision_feature_select_strategy="full", vision_feature_layer=-1,
    use_image_newline_parameter=True, projector_hidden_act="gelu", vocab_size=TEXT["vocab_size"],
    eos_token_id=DEMO_IDS[END], torch_dtype="float32",
)  # fmt: skip
#: llava-onevision-qwen2-0.5b-ov-hf's template (its images first, then its text, each part on a line)
TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + ' ' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ '\n' + content['text'] }}"
    "{% endfor %}{% endif %}{{ '<|im_end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="LlavaOnevisionImageProcessor", processor_class="LlavaOnevisionProcessor",
    do_convert_rgb=True, do_normalize=True, do_pad=True, do_rescale=True, do_resize=True,
    image_grid_pinpoints=PINPOINTS, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], resample=3,
    rescale_factor=1 / 255, size=dict(height=TILE, width=TILE),
)  # fmt: skip
PROCESSOR: dict[str, Any] = dict(
    processor_class="LlavaOnevisionProcessor", num_image_tokens=(TILE // PATCH) ** 2,
    vision_feature_select_strategy="full", image_token="<image>", video_token="<video>",
)  # fmt: skip


def build_llava_onevision(folder: Path) -> Path:
    """A tiny LLaVA-OneVision (llava-onevision-qwen2-0.5b-ov-hf's layout)."""
    return write_folder(
        folder,
        Family(
            module="llava_onevision",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=DEMO_IDS[END],
            tokenizer=dict(bos_token=None, processor_class="LlavaOnevisionProcessor"),
            processor=PROCESSOR,
            image_processor=IMAGE_PROCESSOR,
            prepend_bos=False,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"llava_onevision": build_llava_onevision}
