"""A tiny DeepSeek-VL2 (`deepseek_vl_v2`, as deepseek-ai/deepseek-vl2-tiny ships it): a SigLIP tower (32x32 tiles in
8x8 patches, width 32, 2 layers), the projector's 2x2 downsampling MLP with its image_newline and view_separator,
and a DeepSeek-V2 text model (hidden 64, 2 layers: multi-head latent attention, the second layer a mixture of 2
routed experts and a shared one). mlx-vlm's DeepseekVLV2Processor reads an image as a 32x32 global view (2x2 image tokens,
each row ended by a newline token), the view separator, then one 32x32 local tile's. (mlx-vlm 0.7.10's own greedy
answers for it differ from one process to the next: the prompt's embeddings and logits agree, its decode steps do
not, with one tile or several.) The chat
template is the processor's own (DeepSeek's "<|User|>: … <|Assistant|>:"; the hub has none in the tokenizer), which
reads an image part as <image> and a newline. Added tokens, in the order the processor adds its own: <｜▁pad▁｜> 2048,
<image>, the grounding tokens, <|User|>, <|Assistant|>; the tokenizer prepends <|im_start|> as DeepSeek's prepends
<｜begin▁of▁sentence｜>, and <|im_end|> ends an answer. Keys as mlx-vlm names them (`language_model.*`,
`vision.vision_tower.*`, `projector.*`), the experts stacked."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, END, START, Family, added_ids, write_folder

PAD = "<｜▁pad▁｜>"
TOKENS = [PAD, "<image>", "<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>", "<|grounding|>", "<|User|>", "<|Assistant|>"]
IDS = added_ids(TOKENS)
TILE, PATCH = 32, 8
RESOLUTIONS = [[32, 32]]
TEXT: dict[str, Any] = dict(
    model_type="deepseek_v2", vocab_size=DEMO_VOCAB + len(TOKENS), hidden_size=64, intermediate_size=128,
    moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
    n_routed_experts=2, routed_scaling_factor=1.0, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
    v_head_dim=16, qk_nope_head_dim=16, topk_method="greedy", n_group=1, topk_group=1, num_experts_per_tok=1,
    moe_layer_freq=1, first_k_dense_replace=1, max_position_embeddings=1024, rms_norm_eps=1e-6,
    rope_theta=10000.0, attention_bias=False, scoring_func="softmax", torch_dtype="float32",
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["DeepseekVLV2ForCausalLM"], model_type="deepseek_vl_v2", language_config=TEXT,
    vision_config=dict(
        model_type="vision", layers=2, width=32, num_attention_heads=2, image_size=TILE, patch_size=PATCH,
        num_channels=3, layer_norm_eps=1e-6, mlp_ratio=2.0, intermediate_size=64,
    ),
    projector_config=dict(
        model_type="mlp_projector", projector_type="downsample_mlp_gelu", input_dim=32, n_embed=64, depth=2,
        mlp_ratio=1, downsample_ratio=2, token_pooling=False,
    ),
    image_token_index=IDS["<image>"], tile_tag="2D", global_view_pos="head", candidate_resolutions=RESOLUTIONS,
    vocab_size=TEXT["vocab_size"], pad_id=IDS[PAD], eos_token_id=DEMO_IDS[END], bos_token_id=DEMO_IDS[START],
    torch_dtype="float32",
)  # fmt: skip
#: DeepseekVLV2Processor's default template, reading a message's parts
TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}<|User|>:{% elif message['role'] == 'assistant' %}<|Assistant|>{% endif %} "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '<image>\n' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}\n\n"
    "{% endfor %}{% if add_generation_prompt %}<|Assistant|>:{% endif %}"
)
PROCESSOR: dict[str, Any] = dict(
    processor_class="DeepseekVLV2Processor", candidate_resolutions=RESOLUTIONS, patch_size=PATCH,
    downsample_ratio=2, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], normalize=True,
    image_token="<image>", pad_token=PAD, add_special_token=False, sft_format="deepseek", mask_prompt=True,
    ignore_id=-100,
)  # fmt: skip


def build_deepseek_vl_v2(folder: Path) -> Path:
    """A tiny DeepSeek-VL2 (deepseek-vl2-tiny's layout)."""
    return write_folder(
        folder,
        Family(
            module="deepseek_vl_v2",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=DEMO_IDS[END],
            tokenizer=dict(pad_token=PAD, processor_class="DeepseekVLV2Processor"),
            processor=PROCESSOR,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"deepseek_vl_v2": build_deepseek_vl_v2}
