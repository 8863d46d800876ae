"""Tiny Kimi K2.5 (`kimi_k25`, as moonshotai/Kimi-K2.5 ships it): Kimi-VL's kin (tests/vlms/kimi.py): a MoonViT tower
(native resolution in 8x8 patches, its position embeddings a 4x4 grid resized to the image's, hidden 32, 2 layers),
the projector merging 2x2 patches into an image token, and a DeepSeek-V3 text model (hidden 64, 2 layers: multi-head
latent attention, the second layer a mixture of 2 routed experts and a shared one). Its processor pads an image to
whole 16-pixel blocks and writes one <|media_pad|> per 2x2 patches in place of the template's one; the tokens and the
template are Kimi-VL's. Keys as mlx-vlm names them (its sanitize strips a tower's `encoder.`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.tiny_kinds import write_json
from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, END, Family, added_ids, write_folder
from tests.vlms.kimi import IDS, PATCH, TEMPLATE, TEXT, TOKENS

VISION: dict[str, Any] = dict(
    model_type="moonvit", depth=2, embed_dim=32, hidden_size=32, num_heads=2, patch_size=PATCH,
    intermediate_size=64, init_pos_emb_height=4, init_pos_emb_width=4, merge_kernel_size=[2, 2], num_channels=3,
)  # fmt: skip


def build_kimi_k25(folder: Path) -> Path:
    """A tiny Kimi K2.5 (Kimi-K2.5's layout)."""
    config = dict(
        architectures=["KimiK25ForConditionalGeneration"], model_type="kimi_k25", text_config=TEXT,
        vision_config=VISION, media_placeholder_token_id=IDS["<|media_pad|>"], vocab_size=TEXT["vocab_size"],
        eos_token_id=[DEMO_IDS[END]], pad_token_id=DEMO_IDS["<|endoftext|>"], torch_dtype="float32",
    )  # fmt: skip
    return write_folder(
        folder,
        Family(
            module="kimi_k25",
            config=config,
            tokens=TOKENS,
            template=TEMPLATE,
            eos=DEMO_IDS[END],
            tokenizer=dict(bos_token=None, processor_class="KimiK25Processor"),
            processor=dict(processor_class="KimiK25Processor"),
            image_processor=dict(
                processor_class="KimiK25Processor",
                media_proc_cfg=dict(patch_size=PATCH, in_patch_limit=64, merge_kernel_size=[2, 2]),
            ),
            prepend_bos=False,
        ),
    )


#: Kimi K3 (`kimi_k3`, as moonshotai/Kimi-K3 ships it): a MoonViT-3D tower (14x14 patches, as mlx-vlm's image
#: processor cuts them whatever the config says; hidden 32, 2 layers), the 2x2 merging projector, and a Kimi-Linear-like
#: text model (hidden 64, 2 layers: the first Kimi delta attention, the second multi-head latent attention with a
#: mixture of 2 routed experts and a shared one). Its chat is rendered by the processor's own Python (XTML:
#: <|open|>message role="user"<|sep|>...<|close|>, an image <|kimi_image_placeholder|>, which the processor writes as
#: <|media_begin|>image WxH<|media_content|>, one <|media_pad|> per 2x2 patches, <|media_end|>).
TOKENS3 = [
    "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "<|kimi_image_placeholder|>", "<|media_begin|>",
    "<|media_content|>", "<|media_end|>", "<|media_pad|>",
]  # fmt: skip
IDS3 = added_ids(TOKENS3)
TEXT3: dict[str, Any] = dict(
    model_type="kimi_linear", vocab_size=DEMO_VOCAB + len(TOKENS3), hidden_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=4, intermediate_size=128, rms_norm_eps=1e-5,
    max_position_embeddings=1024, hidden_act="situ",
    linear_attn_config=dict(kda_layers=[1], num_heads=4, head_dim=16, short_conv_kernel_size=4),
    q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    num_experts=2, num_experts_per_token=1, num_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1,
    tie_word_embeddings=False,
)  # fmt: skip
VISION3: dict[str, Any] = dict(
    model_type="moonvit3d", patch_size=14, init_pos_emb_height=4, init_pos_emb_width=4, init_pos_emb_time=2,
    vt_num_attention_heads=2, vt_num_hidden_layers=2, vt_hidden_size=32, vt_intermediate_size=64,
    qkv_hidden_size=96, merge_kernel_size=[2, 2], mm_hidden_size=32, text_hidden_size=64,
)  # fmt: skip


def build_kimi_k3(folder: Path) -> Path:
    """A tiny Kimi K3 (Kimi-K3's layout)."""
    config = dict(
        architectures=["KimiK3ForConditionalGeneration"], model_type="kimi_k3", text_config=TEXT3,
        vision_config=VISION3, media_placeholder_token_id=IDS3["<|media_pad|>"], vocab_size=TEXT3["vocab_size"],
        eos_token_id=[IDS3["<|end_of_msg|>"]], torch_dtype="float32",
    )  # fmt: skip
    write_folder(
        folder,
        Family(
            module="kimi_k3",
            config=config,
            tokens=TOKENS3,
            template="",
            eos=IDS3["<|end_of_msg|>"],
            tokenizer=dict(bos_token=None, eos_token="<|end_of_msg|>", processor_class="KimiK3Processor"),
            processor=dict(processor_class="KimiK3Processor"),
            image_processor=dict(processor_class="KimiK3Processor", media_proc_cfg=dict(patch_size=14)),
            prepend_bos=False,
        ),
    )
    return _without_template(folder)


def _without_template(folder: Path) -> Path:
    """The folder without a chat template (Kimi K3's chat is rendered by its processor's Python, as the hub's)."""
    (folder / "chat_template.json").unlink()
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    del settings["chat_template"]
    write_json(folder / "tokenizer_config.json", settings)
    return folder


ARCHS: dict[str, Callable[[Path], Path]] = {"kimi_k25": build_kimi_k25, "kimi_k3": build_kimi_k3}
