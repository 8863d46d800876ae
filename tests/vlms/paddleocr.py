"""A tiny PaddleOCR-VL (`paddleocr_vl`, as PaddlePaddle/PaddleOCR-VL ships it): a SigLIP-style NaViT tower (native
resolution in 8x8 patches, hidden 32, 2 layers), the projector merging 2x2 patches into an image token, and an ERNIE
4.5 text model (2 layers, 4 query heads and 2 KV heads of 16, hidden 1,024 as the hub's: mlx-vlm's tower projects to
1,024 whatever the config says; 6 M parameters) whose rotary positions are 3-D (M-RoPE,
sections 2, 3, 3: an image's tokens are placed by their row and column), its text config at config.json's top level
as the hub's. mlx-vlm's PaddleOCRVLProcessor resizes an image to whole 16-pixel blocks within 256 to 4,096 pixels,
so images of other shapes give prompts of other lengths: <|IMAGE_START|>, one <|IMAGE_PLACEHOLDER|> per 2x2 patches,
<|IMAGE_END|>. Added tokens: <|IMAGE_PLACEHOLDER|> 2048, <|IMAGE_START|>, <|IMAGE_END|>, <|video_pad|>,
<|begin_of_sentence|>, <|end_of_sentence|> (its answers' end). Keys as mlx-vlm names them (its sanitize keeps a
checkpoint whose keys start with `language_model.`, as mlx-community's conversions)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_VOCAB, Family, added_ids, write_folder

TOKENS = [
    "<|IMAGE_PLACEHOLDER|>", "<|IMAGE_START|>", "<|IMAGE_END|>", "<|video_pad|>", "<|begin_of_sentence|>",
    "<|end_of_sentence|>",
]  # fmt: skip
IDS = added_ids(TOKENS)
EOS = IDS["<|end_of_sentence|>"]
PATCH = 8
CONFIG: dict[str, Any] = dict(
    architectures=["PaddleOCRVLForConditionalGeneration"], model_type="paddleocr_vl", hidden_size=1024,
    num_hidden_layers=2, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    rms_norm_eps=1e-5, vocab_size=DEMO_VOCAB + len(TOKENS), max_position_embeddings=1024, rope_theta=500000.0,
    rope_scaling=dict(rope_type="default", type="default", mrope_section=[2, 3, 3]), hidden_act="silu",
    use_bias=False, tie_word_embeddings=False, pad_token_id=0, bos_token_id=IDS["<|begin_of_sentence|>"],
    eos_token_id=EOS, image_token_id=IDS["<|IMAGE_PLACEHOLDER|>"], video_token_id=IDS["<|video_pad|>"],
    vision_start_token_id=IDS["<|IMAGE_START|>"], vision_end_token_id=IDS["<|IMAGE_END|>"],
    vision_config=dict(
        model_type="paddleocr_vl", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_channels=3, image_size=32, patch_size=PATCH, hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=1e-6, spatial_merge_size=2,
    ),
    torch_dtype="float32",
)  # fmt: skip
#: PaddleOCR-VL's template's turns
TEMPLATE = (
    "{{ '<|begin_of_sentence|>' }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ 'User: ' }}{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' }}"
    "{% endif %}{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '\n' }}{% else %}{{ '<|end_of_sentence|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant: ' }}{% endif %}"
)
IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="PaddleOCRVLImageProcessor", processor_class="PaddleOCRVLProcessor", min_pixels=256,
    max_pixels=4096, patch_size=PATCH, temporal_patch_size=1, merge_size=2, image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5], do_resize=True, do_rescale=True, do_normalize=True, do_convert_rgb=True,
)  # fmt: skip


def build_paddleocr_vl(folder: Path) -> Path:
    """A tiny PaddleOCR-VL (PaddleOCR-VL-0.9B's layout)."""
    return write_folder(
        folder,
        Family(
            module="paddleocr_vl",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=EOS,
            tokenizer=dict(
                bos_token="<|begin_of_sentence|>",
                eos_token="<|end_of_sentence|>",
                processor_class="PaddleOCRVLProcessor",
            ),
            processor=dict(processor_class="PaddleOCRVLProcessor"),
            image_processor=IMAGE_PROCESSOR,
            prepend_bos=False,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"paddleocr_vl": build_paddleocr_vl}
