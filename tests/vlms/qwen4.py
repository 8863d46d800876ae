"""A tiny Qwen4-Exp (`qwen4_exp`), built as tests/vlms/qwen.py builds Qwen 3.5 (read its docstring: the same tokens,
template, image processor and tower, without deepstack; mlx-vlm's processor for it is Qwen3-VL's): a text model of
a gated-delta linear attention layer, then a sparse-attention one (QSA: an indexer of 2 heads choosing 16 keys in
blocks of 4), each layer's MLP a mixture of 4 routed experts (2 a token) beside a shared one, the residual stream
kept as 2 hyper-connection copies (rank 8), and no per-layer embeddings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.qwen import QWEN3_5, TEMPLATE3, _build

QWEN4_EXP: dict[str, Any] = dict(
    QWEN3_5, architectures=["Qwen4ExpForConditionalGeneration"], model_type="qwen4_exp",
    text_config=dict(
        QWEN3_5["text_config"], model_type="qwen4_exp_text", num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32, hc_count=2, hc_lowrank=8, ple_layer_ids=[],
        indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=16, indexer_compress_ratio=4,
    ),
    vision_config=dict(QWEN3_5["vision_config"], model_type="qwen4_exp"),
)  # fmt: skip


def build_qwen4_exp(folder: Path) -> Path:
    """A tiny Qwen4-Exp (see the module's docstring)."""
    from mlx_vlm.models import qwen4_exp

    _build(qwen4_exp, QWEN4_EXP, TEMPLATE3, "Qwen3VLProcessor")(folder)
    return folder


ARCHS: dict[str, Callable[[Path], Path]] = {"qwen4_exp": build_qwen4_exp}
