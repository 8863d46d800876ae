"""A tiny Muse Glimmer (`muse_glimmer`): a windowed ViT (14x14 patches, temporal patches of 2, merged 2x2, position
embeddings a 4x4 grid; hidden 32, 2 layers), the projector, and its text model (hidden 64, 2 layers: the first
sliding, the second full attention; logits soft-capped). Its processor writes an image as <|image_start|>, one
<|patch|> per 2x2 patches, <|image_end|> in place of the template's <|patch|>; the template is ChatML's. Keys as
mlx-vlm names them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_IDS, DEMO_VOCAB, END, Family, added_ids, write_folder
from tests.vlms.molmo import TEMPLATE2

TOKENS = ["<|patch|>", "<|image_start|>", "<|image_end|>", "<|video|>", "<|image_placeholder|>"]
IDS = added_ids(TOKENS)
EOS = DEMO_IDS[END]
CONFIG: dict[str, Any] = dict(
    architectures=["MuseGlimmerForConditionalGeneration"], model_type="muse_glimmer",
    text_config=dict(
        vocab_size=DEMO_VOCAB + len(TOKENS), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, sliding_window=16,
        bos_token_id=None, eos_token_id=EOS,
    ),
    vision_config=dict(
        patch_size=14, patch_temporal=2, merge_size=2, pos_emb_height=4, pos_emb_width=4, hidden_size=32,
        intermediate_size=64, num_attention_heads=2, num_hidden_layers=2,
    ),
    image_token_id=IDS["<|patch|>"], video_token_id=IDS["<|video|>"], out_hidden_size=128, projector_hidden_size=64,
    eos_token_id=EOS, torch_dtype="float32",
)  # fmt: skip


def build_muse_glimmer(folder: Path) -> Path:
    """A tiny Muse Glimmer."""
    return write_folder(
        folder,
        Family(
            module="muse_glimmer",
            config=CONFIG,
            tokens=TOKENS,
            template=TEMPLATE2.replace("<|image|>", "<|patch|>"),
            eos=EOS,
            tokenizer=dict(bos_token=None, processor_class="MuseGlimmerProcessor"),
            processor=dict(processor_class="MuseGlimmerProcessor", max_image_tokens=16),
            prepend_bos=False,
        ),
    )


#: Muse Spark (`muse_spark`): Muse Glimmer's kin, its text model all mixtures of experts (2, one a token), its
#: tower's position table resized to the image; a tiny audio encoder (transformers' config check asks for one). The image
#: is written as <|image_start|>, its <|patch|>es, <|image_end|> in place of the template's <|patch|>.
SPARK: dict[str, Any] = dict(
    architectures=["MuseSparkForConditionalGeneration"], model_type="muse_spark",
    text_config=dict(
        vocab_size=DEMO_VOCAB + len(TOKENS), hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, num_hidden_layers=2, rms_norm_eps=1e-5, post_norm_eps=1e-8,
        rope_parameters=dict(rope_theta=500000.0, rope_type="default"), layer_rope_theta=[10000.0, 500000.0],
        layer_types=["sliding_attention", "full_attention"], sliding_window=16, final_logit_softcapping=20.0,
        output_multiplier=0.2, num_local_experts=2, num_experts_per_tok=1, moe_hidden_size=32,
        moe_intermediate_size=32,
    ),
    vision_config=dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=14,
        patch_temporal=2, merge_size=2, pos_emb_height=4, pos_emb_width=4,
    ),
    audio_config=dict(
        patch_sizes=[4, 2], hidden_sizes=[16, 32], depths=[1, 1], num_hidden_layers=2, out_hidden_size=64,
    ),
    image_token_id=IDS["<|patch|>"], video_token_id=IDS["<|video|>"], eos_token_id=[EOS], torch_dtype="float32",
)  # fmt: skip


def build_muse_spark(folder: Path) -> Path:
    """A tiny Muse Spark."""
    return write_folder(
        folder,
        Family(
            module="muse_spark",
            config=SPARK,
            tokens=TOKENS,
            template=TEMPLATE2.replace("<|image|>", "<|patch|>"),
            eos=EOS,
            tokenizer=dict(bos_token=None, processor_class="MuseSparkProcessor"),
            processor=dict(processor_class="MuseSparkProcessor", image_processor=dict(max_image_tokens=16)),
            prepend_bos=False,
        ),
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"muse_glimmer": build_muse_glimmer, "muse_spark": build_muse_spark}
