"""Tiny random-weight Qwen mixture-of-experts vision-language folders (M-RoPE), built as tests/vlms/qwen.py builds
its families (read its docstring: the same tokens, template, image processor and tower).

- `qwen3_5_moe` (Qwen 3.5's MoE, as Qwen/Qwen3.5-35B-A3B ships it): Qwen 3.5's tower and hybrid text model (a
  gated-delta linear attention layer, then a full-attention one), each layer's MLP a mixture of 4 routed experts (2
  a token) beside a gated shared expert.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.vlms.qwen import QWEN3_5, TEMPLATE3, _build

QWEN3_5_MOE: dict[str, Any] = dict(
    QWEN3_5, architectures=["Qwen3_5MoeForConditionalGeneration"], model_type="qwen3_5_moe",
    text_config=dict(
        QWEN3_5["text_config"], model_type="qwen3_5_moe_text", num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32,
    ),
    vision_config=dict(QWEN3_5["vision_config"], model_type="qwen3_5_moe"),
)  # fmt: skip


def build_qwen3_5_moe(folder: Path) -> Path:
    """A tiny Qwen 3.5 MoE."""
    from mlx_vlm.models import qwen3_5_moe

    _build(qwen3_5_moe, QWEN3_5_MOE, TEMPLATE3, "Qwen3VLProcessor")(folder)
    return folder


ARCHS: dict[str, Callable[[Path], Path]] = {"qwen3_5_moe": build_qwen3_5_moe}
