"""A tiny Step 3.7 (`step3p7`, as stepfun-ai's Step-3.7 ships it): a Perception-Encoder tower (728x728 images in 14x14
patches and 504x504 crops of larger ones, the sizes mlx-vlm's processor fixes; width 32, 2 layers, 2-D RoPE), two
downsampling convolutions and a projector (169 tokens an image, 81 a crop), and a Step 3.5 text model (hidden 64, 2
layers, the second a mixture of 2 experts and a shared one). Its processor reads one image a prompt, written where
the template's <im_patch> is: each crop's <patch_start>, 81 <im_patch>, <patch_end> (a <patch_newline> after a row),
then <im_start>, 169 <im_patch>, <im_end>. The template is ChatML's. Keys as the hub's: `model.*`, `lm_head.*`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, END, Family, added_ids, write_folder
from tests.vlms.molmo import TEMPLATE2

TOKENS = ["<im_patch>", "<im_start>", "<im_end>", "<patch_start>", "<patch_end>", "<patch_newline>"]
IDS = added_ids(TOKENS)
EOS = DEMO_IDS[END]
TEXT: dict[str, Any] = dict(
    model_type="step3p5", hidden_size=64, intermediate_size=128, num_attention_heads=4, num_attention_groups=2,
    num_hidden_layers=2, head_dim=16, vocab_size=DEMO_VOCAB + len(TOKENS), max_position_embeddings=4096,
    max_seq_len=4096, moe_intermediate_size=32, moe_num_experts=2, moe_top_k=1, share_expert_dim=32,
    moe_layers_enum=[1], rope_theta=10000.0, eos_token_id=EOS, pad_token_id=0, sliding_window=64,
    layer_types=["sliding_attention", "full_attention"],
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["Step3VLForConditionalGeneration"], model_type="step3p7", text_config=TEXT,
    vision_config=dict(model_type="perception_encoder", width=32, layers=2, heads=2, image_size=728, patch_size=14,
                       mlp_ratio=2.0),
    image_token_id=IDS["<im_patch>"], vocab_size=TEXT["vocab_size"], eos_token_id=EOS, torch_dtype="float32",
)  # fmt: skip


def _hub_key(name: str) -> str:
    for mine, hub in (
        ("language_model.model.", "model."),
        ("language_model.lm_head", "lm_head"),
        ("vision_model.", "model.vision_model."),
        ("vit_large_projector.", "model.vit_large_projector."),
    ):
        if name.startswith(mine):
            return hub + name[len(mine) :]
    return name


def build_step3p7(folder: Path) -> Path:
    """A tiny Step 3.7."""
    return write_folder(
        folder,
        Family(
            module="step3p7",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE2.replace("<|image|>", "<im_patch>"),
            eos=EOS,
            tokenizer=dict(bos_token=None, processor_class="Step3VLProcessor"),
            processor=dict(processor_class="Step3VLProcessor"),
            prepend_bos=False,
            hub_key=_hub_key,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"step3p7": build_step3p7}
