"""A tiny Nemotron 3 Nano Omni (`nemotron_h_nano_omni`, as nvidia's Nemotron-3-Nano-Omni ships it; its audio path not
built): a RADIO ViT (16x16 patches, hidden 32, 2 layers, one class token), pixel shuffle 2x2 and the squared-ReLU
projector, and a Nemotron-H text model (hidden 64; a Mamba-2 layer, an attention layer, an MLP layer). Its processor
(mlx-vlm's own) resizes an image to 16-64 patches keeping its aspect and writes it as <img>, one <image> per 2x2
patches, </img> in place of the template's <image>; the template is ChatML's with the image before the text. Keys as
mlx-vlm names them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, END, Family, added_ids, write_folder

TOKENS = ["<image>", "<img>", "</img>", "<video>", "<so_embedding>", "<so_start>", "<so_end>"]
IDS = added_ids(TOKENS)
PATCH = 16
TEXT: dict[str, Any] = dict(
    model_type="nemotron_h", vocab_size=DEMO_VOCAB + len(TOKENS), hidden_size=64, intermediate_size=128,
    max_position_embeddings=4096, num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_bias=False,
    mamba_num_heads=8, mamba_head_dim=16, mamba_proj_bias=False, ssm_state_size=16, conv_kernel=3, n_groups=2,
    mlp_bias=False, layer_norm_epsilon=1e-5, use_bias=False, use_conv_bias=True, residual_in_fp32=True,
    hybrid_override_pattern=["M", "*", "-"], time_step_limit=[0.0, 1e9], tie_word_embeddings=False,
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["NemotronH_Nano_Omni_Reasoning_V3"], model_type="nemotron_h_nano_omni", llm_config=TEXT,
    vision_config=dict(
        model_type="radio", args={}, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, patch_size=PATCH, image_size=64, max_resolution=128,
    ),
    downsample_ratio=0.5, ps_version="v2", projector_hidden_size=64, vit_hidden_size=32,
    img_context_token_id=IDS["<image>"], video_context_token_id=IDS["<video>"],
    sound_context_token_id=IDS["<so_embedding>"], eos_token_id=DEMO_IDS[END], torch_dtype="float32",
)  # fmt: skip
#: ChatML's turns, each image part rendering <image> (then a newline), before its message's text
TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<image>\n{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_nemotron_h_nano_omni(folder: Path) -> Path:
    """A tiny Nemotron 3 Nano Omni (its vision and text; no sound encoder)."""
    return write_folder(
        folder,
        Family(
            module="nemotron_h_nano_omni",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=DEMO_IDS[END],
            tokenizer=dict(bos_token=None, eos_token=END, processor_class="NemotronHNanoOmniProcessor"),
            processor=dict(processor_class="NemotronHNanoOmniProcessor"),
            image_processor=dict(
                processor_class="NemotronHNanoOmniProcessor",
                patch_size=PATCH,
                downsample_ratio=0.5,
                min_num_patches=16,
                max_num_patches=64,
                norm_mean=[0.48145466, 0.4578275, 0.40821073],
                norm_std=[0.26862954, 0.26130258, 0.27577711],
            ),
            prepend_bos=False,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"nemotron_h_nano_omni": build_nemotron_h_nano_omni}
