"""A tiny Inkling (`inkling`, as its 0.6B checkpoint ships it; its audio path not built): its vision encoder (40x40
patches, temporal patches of 2, an HMLP of 2 layers, as its processor makes them whatever its config says), and its
text model (hidden 64, 2 layers: a sliding-window one with a dense MLP, a global one with a mixture of 4 experts and a
shared one; relative position biases, short convolutions). Its processor writes an image as <|content_image|>, then
one <|unused_200054|> per patch; the template is ChatML's with the image before the text. Keys as mlx-vlm names
them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, END, Family, added_ids, write_folder
from tests.vlms.nemotron import TEMPLATE

TOKENS = ["<|unused_200054|>", "<|content_image|>", "<|unused_200053|>", "<|content_audio_input|>"]
IDS = added_ids(TOKENS)
VOCAB = DEMO_VOCAB + len(TOKENS)
TEXT: dict[str, Any] = dict(
    model_type="inkling", hidden_size=64, num_hidden_layers=2, vocab_size=VOCAB, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=16,
    sliding_window_size=16, layer_types=["hybrid_sliding", "full"], mlp_layer_types=["dense", "moe"], d_rel=4,
    rel_extent=64, intermediate_size=32, dense_intermediate_size=128, n_routed_experts=4, num_experts_per_tok=2,
    n_shared_experts=1, max_position_embeddings=4096,
)  # fmt: skip
CONFIG: dict[str, Any] = dict(
    architectures=["InklingForConditionalGeneration"], model_type="inkling", text_config=TEXT,
    vision_config=dict(model_type="inkling_vision", patch_size=40, temporal_patch_size=2, n_layers=2),
    audio_config=dict(model_type="inkling_audio"), image_token_id=IDS["<|unused_200054|>"],
    audio_token_id=IDS["<|unused_200053|>"], vocab_size=VOCAB, eos_token_id=[DEMO_IDS[END]], torch_dtype="float32",
)  # fmt: skip


def build_inkling(folder: Path) -> Path:
    """A tiny Inkling (its vision and text; no audio)."""
    return write_folder(
        folder,
        Family(
            module="inkling",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE.replace("<image>\n", "<|unused_200054|>"),
            eos=DEMO_IDS[END],
            tokenizer=dict(bos_token=None, eos_token=END),
            processor=dict(image_token="<|unused_200054|>", image_bos_token="<|content_image|>"),
            prepend_bos=False,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"inkling": build_inkling}
