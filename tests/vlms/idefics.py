"""The Idefics family: Idefics 3 (`idefics3`, SmolVLM's layout: tests/tiny_vision.py's folder, its docstring says
how it is built), SmolVLM 2 (`smolvlm`, as HuggingFaceTB/SmolVLM2-256M-Video-Instruct ships it) and Idefics 2
(`idefics2`, as HuggingFaceM4/idefics2-8b ships it).

SmolVLM 2 is Idefics 3's folder under its own model_type and processor (mlx-vlm's SmolVLMProcessor, which hands its
tokenizer's template to the processor: mlx-vlm renders with the processor's), the vision tower `smolvlm_vision`.
Idefics 2 has a SigLIP-style tower (32x32 images, 8x8 patches, hidden 32, 2 layers), a perceiver resampler (one
layer, 4 latents: an image is 4 <image> tokens between two <fake_token_around_image>), and a Mistral text model
(hidden 64, 2 layers); its tokenizer prepends <|im_start|> as Mistral's prepends <s>. Added tokens as the hub's:
<fake_token_around_image> 2048, <image> 2049, <end_of_utterance> 2050 (its answers' end). Keys as the hub's:
`model.vision_model.*`, `model.connector.*`, `model.text_model.*`, `lm_head.weight`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.tiny_vision import (
    IDEFICS3,
    IDEFICS3_CHAT_TEMPLATE,
    IDEFICS3_EOS,
    IDEFICS3_IMAGE_PROCESSOR,
    IDEFICS3_IMAGE_TOKENS,
    IDEFICS3_TOKENS,
    IDEFICS3_VISION,
    _idefics3_hub_key,
    build_idefics3,
)
from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, START, Family, added_ids, write_folder

SMOLVLM: dict[str, Any] = dict(
    IDEFICS3, architectures=["SmolVLMForConditionalGeneration"], model_type="smolvlm",
    vision_config=dict(IDEFICS3_VISION, model_type="smolvlm_vision"),
)  # fmt: skip

IDEFICS2_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>"]
IDEFICS2_IDS = added_ids(IDEFICS2_TOKENS)
IDEFICS2_IMAGE_SIZE, IDEFICS2_LATENTS = 32, 4
IDEFICS2_TEXT: dict[str, Any] = dict(
    model_type="mistral", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=DEMO_VOCAB + len(IDEFICS2_TOKENS), rope_theta=10000.0,
    max_position_embeddings=1024, tie_word_embeddings=False, torch_dtype="float32",
)  # fmt: skip
IDEFICS2: dict[str, Any] = dict(
    architectures=["Idefics2ForConditionalGeneration"], model_type="idefics2", text_config=IDEFICS2_TEXT,
    vision_config=dict(
        model_type="idefics2", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=IDEFICS2_IMAGE_SIZE, patch_size=8, num_channels=3, layer_norm_eps=1e-6,
        hidden_act="gelu_pytorch_tanh",
    ),
    perceiver_config=dict(
        model_type="idefics2", hidden_act="silu", resampler_n_latents=IDEFICS2_LATENTS, resampler_depth=1,
        resampler_n_heads=2, resampler_head_dim=16, num_key_value_heads=1,
    ),
    image_token_id=IDEFICS2_IDS["<image>"], vocab_size=IDEFICS2_TEXT["vocab_size"], pad_token_id=DEMO_IDS["<|endoftext|>"],
    bos_token_id=DEMO_IDS[START], eos_token_id=IDEFICS2_IDS["<end_of_utterance>"], tie_word_embeddings=False,
    torch_dtype="float32",
)  # fmt: skip
#: idefics2-8b's template
IDEFICS2_TEMPLATE = (
    "{% for message in messages %}{{ message['role'].capitalize() }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
IDEFICS2_IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="Idefics2ImageProcessor", processor_class="Idefics2Processor", do_convert_rgb=True,
    do_image_splitting=False, do_normalize=True, do_pad=True, do_rescale=True, do_resize=True,
    image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], resample=2, rescale_factor=1 / 255,
    size=dict(longest_edge=IDEFICS2_IMAGE_SIZE, shortest_edge=IDEFICS2_IMAGE_SIZE),
)  # fmt: skip


def build_smolvlm(folder: Path) -> Path:
    """A tiny SmolVLM 2 (Idefics 3's folder under SmolVLM's model_type and processor)."""
    return write_folder(
        folder,
        Family(
            module="smolvlm",
            config=SMOLVLM,
            tokens=IDEFICS3_TOKENS,
            template=IDEFICS3_CHAT_TEMPLATE,
            eos=IDEFICS3_EOS,
            tokenizer=dict(bos_token=START, eos_token="<end_of_utterance>", processor_class="SmolVLMProcessor"),
            processor=dict(image_seq_len=IDEFICS3_IMAGE_TOKENS, processor_class="SmolVLMProcessor"),
            image_processor=dict(
                IDEFICS3_IMAGE_PROCESSOR,
                image_processor_type="SmolVLMImageProcessor",
                processor_class="SmolVLMProcessor",
            ),
            prepend_bos=False,
            hub_key=_idefics3_hub_key,
        ),
    )


def build_idefics2(folder: Path) -> Path:
    """A tiny Idefics 2 (idefics2-8b's layout: a perceiver resampler's 4 latents an image)."""
    return write_folder(
        folder,
        Family(
            module="idefics2",
            config=IDEFICS2,
            tokens=IDEFICS2_TOKENS,
            template=IDEFICS2_TEMPLATE,
            eos=IDEFICS2_IDS["<end_of_utterance>"],
            tokenizer=dict(processor_class="Idefics2Processor"),
            processor=dict(image_seq_len=IDEFICS2_LATENTS, processor_class="Idefics2Processor"),
            image_processor=IDEFICS2_IMAGE_PROCESSOR,
            hub_key=_idefics3_hub_key,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {
    "idefics2": build_idefics2,
    "idefics3": build_idefics3,
    "smolvlm": build_smolvlm,
}
