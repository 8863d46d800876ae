"""A tiny Kimi-VL (`kimi_vl`, as moonshotai/Kimi-VL-A3B-Instruct ships it): a MoonViT tower (native resolution in
8x8 patches, its position embeddings a 4x4 grid resized to the image's, hidden 32, 2 layers), the projector merging
2x2 patches into an image token, and a DeepSeek-V3 text model (hidden 64, 2 layers: multi-head latent attention,
the second layer a mixture of 2 routed experts and a shared one). mlx-vlm's KimiVLProcessor crops an image to whole
16-pixel blocks (no resize below its in_token_limit), so images of other shapes give prompts of other lengths: an
image part renders <|media_start|>image<|media_content|><|media_pad|><|media_end|>, and the processor writes one
<|media_pad|> per 2x2 patches. Added tokens: <|im_system|> 2048, <|im_user|>, <|im_assistant|>, <|im_middle|>,
<|media_start|>, <|media_content|>, <|media_end|>, <|media_pad|> (the image token); <|im_end|> is the demo
tokenizer's own (its answers' end), and there is no BOS. Keys as the hub's: `language_model.model.*`,
`language_model.lm_head.*`, `vision_tower.*`, `multi_modal_projector.*` (the experts stacked as mlx-vlm stacks
them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, END, Family, added_ids, write_folder

TOKENS = [
    "<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|media_start|>", "<|media_content|>",
    "<|media_end|>", "<|media_pad|>",
]  # fmt: skip
IDS = added_ids(TOKENS)
PATCH = 8
TEXT: dict[str, Any] = dict(
    model_type="deepseek_v3", vocab_size=DEMO_VOCAB + len(TOKENS), hidden_size=64, intermediate_size=128,
    moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
    n_shared_experts=1, n_routed_experts=2, routed_scaling_factor=2.446, kv_lora_rank=16, q_lora_rank=None,
    qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16, topk_method="noaux_tc", scoring_func="sigmoid",
    norm_topk_prob=True, n_group=1, topk_group=1, num_experts_per_tok=1, moe_layer_freq=1, first_k_dense_replace=1,
    max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=800000.0, rope_scaling=None, attention_bias=False,
    tie_word_embeddings=False, torch_dtype="float32",
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["KimiVLForConditionalGeneration"], model_type="kimi_vl", text_config=TEXT,
    vision_config=dict(
        model_type="moonvit", depth=2, embed_dim=32, hidden_size=32, num_heads=2, patch_size=PATCH,
        intermediate_size=64, init_pos_emb_height=4, init_pos_emb_width=4, merge_kernel_size=[2, 2],
        in_token_limit=64, num_channels=3,
    ),
    media_placeholder_token_id=IDS["<|media_pad|>"], vocab_size=TEXT["vocab_size"], eos_token_id=DEMO_IDS[END],
    pad_token_id=DEMO_IDS["<|endoftext|>"], torch_dtype="float32",
)  # fmt: skip
#: Kimi-VL-A3B-Instruct's template (its default system prompt when none is given)
TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and messages[0]['role'] != 'system' -%}"
    "{{ '<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>' }}{%- endif -%}"
    "{%- if message['role'] == 'system' -%}{{ '<|im_system|>' }}{%- endif -%}"
    "{%- if message['role'] == 'user' -%}{{ '<|im_user|>' }}{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}{{ '<|im_assistant|>' }}{%- endif -%}"
    "{{- message['role'] -}}{{ '<|im_middle|>' }}"
    "{%- if message['content'] is string -%}{{- message['content'] + '<|im_end|>' -}}"
    "{%- else -%}{%- for content in message['content'] -%}"
    "{%- if content['type'] == 'image' -%}{{ '<|media_start|>image<|media_content|><|media_pad|><|media_end|>' }}"
    "{%- else -%}{{ content['text'] }}{%- endif -%}{%- endfor -%}{{ '<|im_end|>' }}{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_assistant|>assistant<|im_middle|>' }}{%- endif -%}"
)


def build_kimi_vl(folder: Path) -> Path:
    """A tiny Kimi-VL (Kimi-VL-A3B-Instruct's layout)."""
    return write_folder(
        folder,
        Family(
            module="kimi_vl",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=DEMO_IDS[END],
            tokenizer=dict(bos_token=None, processor_class="KimiVLProcessor"),
            processor=dict(processor_class="KimiVLProcessor"),
            image_processor=dict(
                image_processor_type="KimiVLImageProcessor",
                processor_class="KimiVLProcessor",
                patch_size=PATCH,
                in_token_limit=64,
                merge_kernel_size=[2, 2],
                pad_input=False,
            ),
            prepend_bos=False,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"kimi_vl": build_kimi_vl}
