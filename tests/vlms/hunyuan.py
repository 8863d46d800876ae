"""A tiny HunYuan VL (`hunyuan_vl`, as tencent/HunyuanOCR ships it): a ViT of patch 16 (hidden 32, 2 layers) whose
merger turns 2x2 patches into an image token and ends each row of them with a newline token, and a HunYuan text
model (hidden 64, 2 layers, 4 query heads and 2 KV heads of 16, query/key norms) with XD-RoPE: a
prompt's first pass rotates each token by four positions (its index, and for an image's tokens the image's index,
row and column; sections 2, 2, 2, 2), every later one by its index alone. mlx-vlm's HunYuanVLProcessor names the
image tokens by the hub's ids (image start 120118, end 120119, image 120120), so the special tokens sit at those
(tests/vlms/hub_ids.py: a vocabulary of 120,818), and its image processor is built with its defaults whatever the
folder says: every image is resized to at least 512x512 pixels, 32x32 patches, 16 x 17 + 2 = 274 image tokens. The
chat template writes an image part <image_start><image><image_end> (the tokens' names are this folder's) and the turns
as HunyuanOCR's. Keys as the hub names them (`model.*`, `vit.*`). Its embeddings are untied here (the hub's are
tied): tied to random, mostly filler rows, every answer would be one token repeated, telling nothing; its own
`lm_head` (kept under `language_model.`, as mlx-vlm's sanitize leaves it) makes the answers vary."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import Family, write_folder
from tests.vlms.hub_ids import place

TOKENS = ["<hy_bos>", "<hy_eos>", "<hy_pad>", "<hy_user>", "<hy_assistant>", "<image_start>", "<image_end>",
          "<image>", "<image_newline>"]  # fmt: skip
IDS = dict(zip(TOKENS, [120000, 120020, 120002, 120006, 120007, 120118, 120119, 120120, 120121]))
VOCAB = 120818
EOS = IDS["<hy_eos>"]
TEMPLATE = (
    "{{ '<hy_bos>' }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '<hy_user>' }}"
    "{% elif message['role'] == 'assistant' %}{{ '<hy_assistant>' }}{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image_start><image><image_end>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ '<hy_eos>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<hy_assistant>' }}{% endif %}"
)
SPECIAL: dict[str, Any] = dict(
    bos_token_id=IDS["<hy_bos>"], eos_token_id=EOS, eod_token_id=EOS, pad_id=IDS["<hy_pad>"], pad_token_id=-1,
    image_start_token_id=IDS["<image_start>"], image_end_token_id=IDS["<image_end>"], image_token_id=IDS["<image>"],
    image_newline_token_id=IDS["<image_newline>"], vocab_size=VOCAB, org_vocab_size=VOCAB,
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    SPECIAL, architectures=["HunYuanVLForConditionalGeneration"], model_type="hunyuan_vl", tie_word_embeddings=False,
    text_config=dict(
        SPECIAL, model_type="hunyuan_vl", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, attention_head_dim=16, intermediate_size=128, use_qk_norm=True,
        rope_theta=10000.0, max_position_embeddings=4096, tie_word_embeddings=False, rope_scaling=dict(
            alpha=1000.0, beta_fast=32, beta_slow=1, factor=1.0, mscale=1.0, mscale_all_dim=1.0, type="xdrope",
            xdrope_section=[2, 2, 2, 2],
        ),
    ),
    vision_config=dict(
        model_type="hunyuan_vl", hidden_size=32, out_hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, patch_size=16, spatial_merge_size=2, max_image_size=2048,
    ),
    torch_dtype="float32",
)  # fmt: skip


def hub_key(name: str) -> str:
    """A HunYuan VL weight as the hub names it."""
    if name.startswith("language_model.lm_head."):  # (untied here: mlx-vlm's sanitize keeps it as it is)
        return name
    return name.removeprefix("language_model.").replace("vision_tower.", "vit.", 1)


def build_hunyuan_vl(folder: Path) -> Path:
    """A tiny HunYuan VL (see the module's docstring)."""
    settings = dict(
        bos_token="<hy_bos>", eos_token="<hy_eos>", pad_token="<hy_pad>", processor_class="HunYuanVLProcessor"
    )
    write_folder(
        folder,
        Family(
            module="hunyuan_vl", config=CONFIG, tokens=TOKENS, template=TEMPLATE, eos=EOS, tokenizer=settings,
            processor=dict(processor_class="HunYuanVLProcessor"), prepend_bos=False, hub_key=hub_key,
        ),
    )  # fmt: skip
    place(folder, IDS, VOCAB)
    return folder


ARCHS: dict[str, Callable[[Path], Path]] = {"hunyuan_vl": build_hunyuan_vl}
