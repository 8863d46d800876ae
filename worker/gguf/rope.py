"""Llama 3's rope scaling, from the `rope_freqs` tensor llama.cpp's converter writes for Llama 3.1, 3.2 and 3.3 (the
divisor of each rope frequency, from the HF config's `rope_scaling`, which GGUF keeps no other way). mlx-lm computes
the same divisors from that config; so the config is found again by matching Llama 3's formula (its factor the
largest divisor; 1, 4 and 8192 as every Llama 3 has them), and a file whose divisors are anything else is refused
rather than served with another rope than its own.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from worker.gguf.header import GgufError, Header

TENSOR = "rope_freqs.weight"
LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def scaling(source: Path, header: Header, config: dict[str, Any]) -> dict[str, Any] | None:
    """mlx-lm's `rope_scaling` for the file's rope_freqs tensor; None when it has none, or one of no scaling."""
    tensor = header.tensors.get(TENSOR)
    if tensor is None:
        return None
    half = config["head_dim"] // 2
    if tensor.dims != (half,) or tensor.type_name not in ("F32", "F16"):
        raise GgufError(f"{header.name}: its {TENSOR} is {tensor.type_name} {list(tensor.dims)}, not F32 [{half}]")
    with open(source, "rb") as file:
        file.seek(tensor.start)
        divisors = np.frombuffer(file.read(tensor.size), "<f4" if tensor.type_name == "F32" else "<f2")
    if divisors.size != half or not np.isfinite(divisors).all():
        raise GgufError(f"{header.name}: its {TENSOR} cannot be read as {half} numbers")
    if np.allclose(divisors, 1.0):
        return None
    found = {"rope_type": "llama3", "factor": float(divisors.max()), **LLAMA3}
    if not np.allclose(divisors, _llama3(config["rope_theta"], config["head_dim"], found), rtol=1e-3):
        raise GgufError(
            f"{header.name}: its {TENSOR} is no Llama 3 rope scaling (factor {found['factor']:g}, "
            "low and high frequency factors 1 and 4, from 8192 positions), the one onelane reproduces"
        )
    return found


def _llama3(base: float, dims: int, scaling: dict[str, Any]) -> np.ndarray:
    """The divisors llama.cpp writes for Llama 3's `rope_scaling` (convert_hf_to_gguf.py's LlamaModel)."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_max_position_embeddings"]
    divisors = []
    for i in range(0, dims, 2):
        wavelength = 2 * math.pi * base ** (i / dims)
        if wavelength < context / high:
            divisors.append(1.0)
        elif wavelength > context / low:
            divisors.append(factor)
        else:
            smooth = (context / wavelength - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors)
