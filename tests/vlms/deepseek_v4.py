"""A tiny DeepSeek-V4 with its vision tower (`deepseek_v4`, as deepseek-ai's DeepSeek-V4 vision checkpoints ship it):
a ViT (14x14 patches, hidden 32, 1 layer) and its aligner (3x3 patches a token), and DeepSeek-V4's text model (hidden
64, 2 layers: the first routing by a hash of the token, the second compressing its keys 4 to 1; hyper-connections of
4 streams, a mixture of 4 experts and a shared one). Its processor writes an image as ids past the vocabulary, one
per kind (start, pad, image, newline, end), padded so that the image starts at a multiple of 4; the template is its
processor's own (<｜User｜> … <｜Assistant｜></think>). Keys as mlx-vlm names them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.folder import DEMO_VOCAB, Family, added_ids, write_folder

TOKENS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "</think>",
          "<｜deepseek_image｜>"]  # fmt: skip
IDS = added_ids(TOKENS)
EOS = IDS["<｜end▁of▁sentence｜>"]
CONFIG: dict[str, Any] = dict(
    architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4", vocab_size=DEMO_VOCAB + len(TOKENS),
    hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=1, head_dim=32, qk_rope_head_dim=16, q_lora_rank=32, o_lora_rank=32, o_groups=2,
    n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, num_hash_layers=1, compress_ratios=[0, 4],
    hc_mult=4, sliding_window=16, index_n_heads=2, index_head_dim=16, index_topk=8, index_block=8, index_keep=4,
    num_nextn_predict_layers=0, max_position_embeddings=4096, vision_n_layers=1, vision_dim=32, vision_n_heads=2,
    vision_inter_dim=64, vision_patch_size=14, vision_downsample_ratio=3, vision_max_n_token=64,
    vision_min_pixels=42 * 42 * 4, bos_token_id=IDS["<｜begin▁of▁sentence｜>"], eos_token_id=EOS,
    torch_dtype="float32",
)  # fmt: skip


#: DeepSeek-V4.1 (`deepseek_v41`): its image span's tokens all its config's image token (told apart by their kinds, given
#: beside the pixels), a text model of hidden 64, 2 layers (the second compressing its keys 2 to 1 and reading the
#: first's), hyper-connections of 4 streams; its n-gram hash embeddings (engram: its tables built from the hub's
#: tokenizer files) left out
CONFIG41: dict[str, Any] = dict(
    architectures=["DeepseekV41ForCausalLM"], model_type="deepseek_v41", vocab_size=DEMO_VOCAB + len(TOKENS),
    hidden_size=64, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
    head_dim=32, qk_rope_head_dim=16, q_lora_rank=32, o_lora_rank=32, o_groups=2, rms_norm_eps=1e-6,
    n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, sliding_window=16, compress_ratios=[0, 2],
    kv_source_layer_ids=[1], index_source_layer_ids=[1], index_n_heads=2, index_head_dim=32, index_topk=8,
    candidate_source_layer_id=-1, candidate_topk_blocks=8, candidate_block_size=4, hc_mult=4, engram_layer_ids=[],
    engram_num_embeddings=[], image_token_id=IDS["<｜deepseek_image｜>"], vision_num_layers=1, vision_hidden_size=32,
    vision_num_heads=2, vision_intermediate_size=64, vision_patch_size=14, vision_downsample_ratio=3,
    vision_min_pixels=42 * 42 * 4, vision_max_image_tokens=64, bos_token_id=IDS["<｜begin▁of▁sentence｜>"],
    eos_token_id=EOS, torch_dtype="float32",
)  # fmt: skip


def _drawn(weights: dict[str, Any]) -> None:
    """Every weight mlx-vlm initialises to zeros (its head, its gates, its hyper-connections' mixers, the image's
    start, end and newline embeddings), biases aside, drawn from a seeded normal: else every answer is token 0. Its
    hash layer's table of each token's experts (`tid2eid`, integers) is drawn as experts: a token's `top_k` in turn
    from a seeded first (an expert out of range would read memory past the experts' weights)."""
    import mlx.core as mx

    zeros = [k for k, v in sorted(weights.items()) if not k.endswith(("bias", "bias_vl", "base")) and not v.any()]
    experts = int(max(v.shape[0] for k, v in weights.items() if k.endswith("switch_mlp.gate_proj.weight")))
    for n, name in enumerate(zeros):
        shape, key = weights[name].shape, mx.random.key(n)
        if name.endswith("tid2eid"):
            first = mx.random.randint(0, experts, (shape[0], 1), key=key)
            weights[name] = ((first + mx.arange(shape[1])) % experts).astype(mx.int32)
        else:
            weights[name] = mx.random.normal(shape, key=key) * shape[-1] ** -0.5


def _build(module: str, config: dict[str, Any]) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        import importlib

        processing = importlib.import_module(f"mlx_vlm.models.{module}.processing_{module}")
        return write_folder(
            folder,
            Family(
                module=module,
                config=config,
                tokens=TOKENS,
                template=processing.DEFAULT_CHAT_TEMPLATE,
                eos=EOS,
                tokenizer=dict(bos_token=None, eos_token="<｜end▁of▁sentence｜>"),
                prepend_bos=False,
                weights=_drawn,
            ),
        )

    return build


ARCHS: dict[str, Callable[[Path], Path]] = {
    "deepseek_v4": _build("deepseek_v4", CONFIG),
    "deepseek_v41": _build("deepseek_v41", CONFIG41),
}
