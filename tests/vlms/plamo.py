"""A tiny PLaMo 2 VL (`plamo2vl`, as pfnet's PLaMo 2 vision-language models ship it): a SigLIP tower (28x28 tiles of
14x14 patches: 4 features a tile, hidden 32, 2 layers), the two-layer image projector and a PLaMo 2 text model
(hidden 64, 2 layers: a Mamba layer, then sliding-window attention; tied embeddings). mlx-vlm's Plamo2VLProcessor
(its own, patched into AutoProcessor) takes one prompt with images and no chat template: it writes the prompt into
its "ja01" instruction template, each image as <siglip2:img>, 4 <plamo:image> a tile (Eagle 2's tiling: up to 24
tiles and a thumbnail), </siglip2:img>; its tokenizer is mlx-vlm's own Plamo2Tokenizer over tokenizer.jsonl (a piece,
its score and kind a line). Its vocabulary here: its special tokens, the image's three, the 256 byte pieces and the
printable ASCII characters (text tokenizes a character a token). Keys as the hub's: `model.*` (the text model),
`vision_model.*`, `image_proj.*` (its biases `._bias`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.tiny_kinds import parameters, save_weights, seeded, write_json
from tests.tiny_vision import _torch_conv
from tests.vlms.folder import model_config

SPECIAL = ["<|plamo:unk|>", "<|plamo:bos|>", "<|plamo:eos|>", "<|plamo:pad|>"]
IMAGE = ["<plamo:image>", "<siglip2:img>", "</siglip2:img>"]
PIECES: list[list[Any]] = [
    *([t, 0.0, "CONTROL"] for t in SPECIAL + IMAGE),
    *([f"<0x{b:02X}>", 0.0, "BYTE"] for b in range(256)),
    *([chr(c), -1.0, "NORMAL"] for c in range(32, 127)),
]
IDS = {row[0]: i for i, row in enumerate(PIECES)}
TILE, PATCH = 28, 14
EOS = IDS["<|plamo:eos|>"]
TEXT: dict[str, Any] = dict(
    model_type="plamo2", hidden_size=64, num_hidden_layers=2, rms_norm_eps=1e-6, tie_word_embeddings=True,
    num_attention_heads=4, num_key_value_heads=2, hidden_size_per_head=16, max_position_embeddings=4096,
    attention_window_size=32, full_attention_idx=[], rope_theta=10000.0, rope_local_theta=10000.0,
    mamba_d_state=8, mamba_d_conv=4, mamba_num_heads=4, mamba_step=2, mamba_chunk_size=16, mamba_enabled=True,
    intermediate_size=128, vocab_size=len(PIECES),
)  # fmt: skip
VISION: dict[str, Any] = dict(
    model_type="siglip_vision_model", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
    num_attention_heads=2, patch_size=PATCH, image_size=TILE, layer_norm_eps=1e-6, image_token_id=IDS[IMAGE[0]],
    image_feature_size=32, image_proj_hidden_size=64,
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["Plamo2VLForConditionalGeneration"], model_type="plamo2vl", text_config=TEXT,
    vision_config=VISION, image_token_index=IDS[IMAGE[0]], eos_token_id=[EOS], torch_dtype="float32",
)  # fmt: skip
IMAGE_PROCESSOR: dict[str, Any] = dict(
    image_processor_type="SiglipImageProcessor", do_normalize=True, do_rescale=True, do_resize=True,
    image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], resample=3, rescale_factor=1 / 255,
    size=dict(height=TILE, width=TILE), patch_size=PATCH, max_image_width=4 * TILE, max_image_height=4 * TILE,
    downsample_ratio=1.0, tile_context_length=256,
)  # fmt: skip


def _hub_key(name: str) -> str:
    if name.startswith("language_model."):
        name = name.removeprefix("language_model.")
    return name[: -len(".bias")] + "._bias" if name.startswith("image_proj.bias") else name


def build_plamo2vl(folder: Path) -> Path:
    """A tiny PLaMo 2 VL (see the module's docstring)."""
    from mlx_vlm.models import plamo2vl

    folder.mkdir(parents=True, exist_ok=True)
    built = parameters(seeded(lambda: plamo2vl.Model(model_config(plamo2vl, CONFIG))))
    weights = {_hub_key(k): _torch_conv(v) if v.ndim == 4 else v for k, v in built.items()}
    save_weights(folder, weights)
    write_json(folder / "config.json", CONFIG)
    write_json(folder / "generation_config.json", dict(eos_token_id=EOS, do_sample=False))
    (folder / "tokenizer.jsonl").write_text("".join(json.dumps(row) + "\n" for row in PIECES))
    write_json(
        folder / "tokenizer_config.json",
        dict(
            tokenizer_class="Plamo2Tokenizer", unk_token=SPECIAL[0], bos_token=SPECIAL[1], eos_token=SPECIAL[2],
            pad_token=SPECIAL[3], add_bos_token=True, add_eos_token=False, additional_special_tokens=IMAGE,
            model_max_length=4096,
        ),
    )  # fmt: skip
    write_json(folder / "preprocessor_config.json", IMAGE_PROCESSOR)
    return folder


ARCHS: dict[str, Callable[[Path], Path]] = {"plamo2vl": build_plamo2vl}
