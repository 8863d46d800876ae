"""A tiny GOT-OCR 2.0 (`got`, as stepfun-ai/GOT-OCR2_0 ships it): its SAM-style image encoder (patch 16, width 32,
a windowed layer (14x14) then a global one, both with relative positions), whose neck and two stride-2 convolutions
turn mlx-vlm's fixed 1,024-pixel image into 16x16 = 256 image features, projected to a Qwen2 text model (hidden 64,
2 layers, 4 query heads and 2 KV heads). mlx-vlm's own GotOcrProcessor resizes every image to 1,024x1,024 and writes
the prompt itself, as GOT was trained: the MPT conversation (a system turn, the user's, <|im_start|>assistant) with
the image as <img>, 256 <imgpad>, </img> before the instruction; so the folder has no chat template (the hub's
tokenizer has none: mlx-vlm passes the user's words through). Added tokens: <img>, </img>, <imgpad> (the config
names their ids: im_start_token, im_end_token, im_patch_token); the turns' <|im_start|>, <|im_end|> are the demo
vocabulary's. Keys as the hub names them (`model.vision_tower_high.*` with its neck as `neck.0`-`neck.3`,
`model.mm_projector_vary.*`, `model.*`, `lm_head.*`); the lm_head untied so that answers vary."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.tiny_vision import PAD
from tests.vlms.folder import DEMO_IDS, END, Family, added_ids, write_folder

TOKENS = ["<img>", "</img>", "<imgpad>"]
IDS = added_ids(TOKENS)
CONFIG: dict[str, Any] = dict(
    architectures=["GOTQwenForCausalLM"], model_type="got", hidden_size=64, intermediate_size=128,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1000000.0,
    max_position_embeddings=4096, vocab_size=max(IDS.values()) + 1, tie_word_embeddings=False,
    im_start_token=IDS["<img>"], im_end_token=IDS["</img>"], im_patch_token=IDS["<imgpad>"], image_token_len=256,
    bos_token_id=DEMO_IDS[PAD], eos_token_id=DEMO_IDS[END], pad_token_id=DEMO_IDS[PAD],
    vision_config=dict(
        model_type="got", img_size=1024, patch_size=16, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0,
        out_chans=32, out_dim=64, window_size=14, global_attn_indexes=[1],
    ),
    torch_dtype="float32",
)  # fmt: skip
NECK = {"conv1.": "neck.0.", "norm1.": "neck.1.", "conv2.": "neck.2.", "norm2.": "neck.3."}


def hub_key(name: str) -> str:
    """A GOT-OCR weight as the hub names it."""
    if name.startswith("vision_tower."):
        rest = name.removeprefix("vision_tower.")
        for mine, hub in NECK.items():
            if rest.startswith(mine):
                rest = hub + rest.removeprefix(mine)
        return "model.vision_tower_high." + rest
    if name.startswith("multi_modal_projector."):
        return name.replace("multi_modal_projector.", "model.mm_projector_vary.", 1)
    return name.removeprefix("language_model.")


def unconv_positions(weights: dict[str, Any]) -> None:
    """The absolute position embedding (1, 64, 64, width) is 4-D but no convolution: the hub stores it as it is, so
    it is turned beforehand against write_folder's turning of every 4-D weight to torch's layout."""
    weights["vision_tower.pos_embed"] = weights["vision_tower.pos_embed"].transpose(0, 2, 3, 1)


def build_got(folder: Path) -> Path:
    """A tiny GOT-OCR 2.0 (see the module's docstring)."""
    write_folder(
        folder,
        Family(
            module="got", config=CONFIG, tokens=TOKENS, template="", eos=DEMO_IDS[END], prepend_bos=False,
            hub_key=hub_key, weights=unconv_positions,
        ),
    )  # fmt: skip
    (folder / "chat_template.json").unlink()  # (the hub's tokenizer has no chat template)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))
    return folder


ARCHS: dict[str, Callable[[Path], Path]] = {"got": build_got}
