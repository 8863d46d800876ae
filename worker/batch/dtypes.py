"""The load-time dtype policy: what a loaded model's weights become (a models file's `dtype`)."""

from __future__ import annotations

import logging
from typing import cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import dequantize_model

from tasks.settings import physical_memory

logger = logging.getLogger(__name__)
QUANTIZED = (nn.QuantizedLinear, nn.QuantizedEmbedding)


def with_dtype(model: nn.Module, dtype: str) -> str:
    """Give a loaded model's weights the dtype its config asks (see ModelConfig.dtype); says what they are now.
    "auto" makes every weight float32 on the CPU, and keeps them as stored on a GPU. On the CPU, quantized matmuls do
    not batch (bench/dtypes.py on SmolLM2-135M, 2 cores: 4-bit 3.8 tok/s alone and 3.9 at 8, float32 14.8 and 63.9),
    and half-precision ones have no BLAS under them (worker/demo, stored as bfloat16: a decode step of 32 sequences
    56 ms, 10 ms as float32; reading 8 prompts of 41 tokens 396 ms, 36 ms as float32). But
    "auto" keeps them as stored where float32 would take more than a quarter of this machine's memory."""
    quantized = any(isinstance(m, QUANTIZED) for _, m in model.named_modules())
    if dtype == "auto":
        half = any(v.dtype in (mx.float16, mx.bfloat16) for _, v in _weights(model))
        dtype = "float32" if (quantized or half) and mx.default_device() == mx.cpu else "stored"
        if dtype == "float32" and (wide := float32_bytes(model)) > physical_memory() // 4:
            dtype = "stored"
            logger.warning(
                "model weights kept as stored: as float32 (faster on the CPU) they would take %.1f GiB, over a quarter "
                'of this machine\'s memory; set dtype = "float32" in the models file to have them anyway',
                wide / 2**30,
            )
    if dtype == "stored":
        return "as stored, quantized" if quantized else "as stored"
    if quantized:
        dequantize_model(model)
    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    return dtype + (", dequantized" if quantized else "")


def float32_bytes(model: nn.Module) -> int:
    """What a model's weights would take as float32: its floating-point arrays, and its quantized matrices unpacked
    (their scales and biases, which go once dequantized, counted too: an overestimate by a few %)."""
    floating = sum(v.size for _, v in _weights(model) if mx.issubdtype(v.dtype, mx.floating))
    packed = sum(int(m.weight.size) * (32 // int(m.bits)) for _, m in model.named_modules() if isinstance(m, QUANTIZED))
    return 4 * (floating + packed)


def _weights(model: nn.Module) -> list[tuple[str, mx.array]]:
    """A model's arrays by name (tree_flatten is typed for any tree: a model's parameters are arrays)."""
    return cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))
