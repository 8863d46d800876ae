"""The part of a GGUF import that MLX does, run as a process of its own (worker/gguf.py starts it): MLX reads the
file's tensors (`mx.load(path, format="gguf")`), and they are written as mlx-lm's llama names them, in one
safetensors file. Should MLX's reader crash on the file (natively: SIGSEGV, an abort), this process dies, not the
worker or the command that asked.

`python -m worker.gguf_tensors SOURCE TARGET [DTYPE]`: exits 0 once TARGET is written; REFUSED with the reason on
stdout when the file cannot be imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mlx.core as mx

from worker.gguf_header import GgufError
from worker.gguf_llama import GROUP_SIZE, target

REFUSED = 2


def write_tensors(source: Path, path: Path, dtype: str | None = None) -> None:
    """The tensors of the GGUF file `source` renamed to mlx-lm's llama layout (`.weight`, and `.scales` / `.biases`
    when quantized) in the safetensors file `path`; with `dtype`, dequantized and cast to it."""
    try:
        weights = mx.load(str(source), format="gguf")
    except (ValueError, RuntimeError) as exc:  # truncated, say: the header was checked, not the data
        raise GgufError(f"{source.name}: not a GGUF file MLX can read ({exc})") from None
    tensors = {}
    for name, array in weights.items():
        stem, _, kind = name.rpartition(".")
        renamed = target(stem)
        if renamed is not None:
            tensors[f"{renamed}.{kind}"] = array
    if dtype is not None:
        tensors = _cast(tensors, getattr(mx, dtype))
    mx.save_safetensors(str(path), tensors, metadata={"format": "mlx"})


def _cast(tensors: dict[str, mx.array], dtype: mx.Dtype) -> dict[str, mx.array]:
    """The tensors dequantized and cast to `dtype` (a quantized weight's bits: its packed width over its groups)."""
    cast = {}
    for name, array in tensors.items():
        stem, _, kind = name.rpartition(".")
        if kind in ("scales", "biases"):
            continue
        scales = tensors.get(f"{stem}.scales")
        if scales is not None:
            bits = array.shape[-1] * 32 // (scales.shape[-1] * GROUP_SIZE)
            array = mx.dequantize(array, scales, tensors[f"{stem}.biases"], GROUP_SIZE, bits)
        cast[name] = array.astype(dtype)
    return cast


def main() -> None:
    source, path, *dtype = sys.argv[1:]
    try:
        write_tensors(Path(source), Path(path), dtype[0] if dtype else None)
    except GgufError as exc:
        print(exc)
        sys.exit(REFUSED)


if __name__ == "__main__":
    main()
