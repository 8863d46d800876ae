"""A tiny MolmoPoint (`molmo_point`, as allenai's MolmoPoint ships it): Molmo 2's tower, pooling and Qwen-3-like text
model (tests/vlms/molmo.py's sizes), and its point predictor (patch, subpatch and 3x3 location heads of 32), which
writes a point as tokens past the vocabulary it scores. Its processor is Molmo 2's rows of <im_patch> and <im_low>
(378x378 crops whatever its config says); the template is Molmo 2's. Added tokens: Molmo 2's, then <|point_patch|>,
<|point_subpatch|>, <|point_location|>. Keys as the hub's (`model.transformer.*`, `model.vit.*`, `lm_head.*`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, END, Family, added_ids, write_folder
from tests.vlms.molmo import TEMPLATE2, TEXT2, TOKENS2, VISION2

TOKENS = [*TOKENS2, "<|point_patch|>", "<|point_subpatch|>", "<|point_location|>"]
IDS = added_ids(TOKENS)
CONFIG: dict[str, Any] = dict(
    architectures=["MolmoPointForConditionalGeneration"], model_type="molmo_point", text_config=TEXT2,
    vision_config=VISION2["vit_config"], adapter_config=VISION2["adapter_config"],
    image_start_token_id=IDS["<im_start>"], image_end_token_id=IDS["<im_end>"], image_patch_id=IDS["<im_patch>"],
    image_high_res_id=IDS["<im_patch>"], image_col_id=IDS["<im_col>"],
    image_non_indexable_patch_id=IDS["<im_low>"], frame_start_token_id=IDS["<frame_start>"],
    frame_end_token_id=IDS["<frame_end>"], patch_token_id=IDS["<|point_patch|>"],
    subpatch_token_id=IDS["<|point_subpatch|>"], location_token_id=IDS["<|point_location|>"], patch_embed_dim=32,
    eos_token_id=[DEMO_IDS[END]], tie_word_embeddings=False, torch_dtype="float32",
)  # fmt: skip


def _drawn(weights: dict[str, Any]) -> None:
    """Its embeddings, output embeddings and the no-point class's vector drawn from a seeded normal (mlx-vlm
    initialises them to zeros: every answer would be token 0)."""
    import mlx.core as mx

    placeholders = ("embedding", "embeddings", "add_no_point_class_embed.vector")
    for n, name in enumerate(sorted(k for k in weights if k.endswith(placeholders))):
        shape = weights[name].shape
        weights[name] = mx.random.normal(shape, key=mx.random.key(n)) * shape[-1] ** -0.5


def _hub_key(name: str) -> str:
    if name.startswith("lm.lm_head."):
        return name.removeprefix("lm.")
    name = name.replace("lm.model.", "model.transformer.", 1)
    return name.replace("vision_model.", "model.vit.", 1) if name.startswith("vision_model.") else name


def build_molmo_point(folder: Path) -> Path:
    """A tiny MolmoPoint."""
    return write_folder(
        folder,
        Family(
            module="molmo_point",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE2,
            eos=DEMO_IDS[END],
            tokenizer=dict(bos_token=None, eos_token=END, processor_class="MolmoPointProcessor"),
            processor=dict(processor_class="MolmoPointProcessor"),
            prepend_bos=False,
            hub_key=_hub_key,
            weights=_drawn,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"molmo_point": build_molmo_point}
