"""The tensors of a GGUF import, in a process of its own (worker/gguf/__init__.py starts it). The process reads and
checks the file's header itself (worker/gguf/header.py, worker/gguf/model.py: it trusts no caller), then reads each
tensor from the place checked there and nowhere else: F32, F16 and BF16 as they are; Q4_0, Q4_1 and Q8_0 repacked bit
for bit as MLX's affine quantized weights (their blocks are groups of 32 with a scale and an offset already); every
other type dequantized by the gguf package (llama.cpp's own numpy dequantizers) and quantized again by MLX, to the bits
STORED_BITS gives. With a dtype, every weight is written dequantized, from the file's own values. Tensors are put back
in mlx-lm's layout (worker/gguf/archs.py) and written in one safetensors file. Native code runs here only: should it
crash, or a model not fit in memory, this process dies, not the worker or the command that asked.

`python -m worker.gguf.tensors SOURCE TARGET [DTYPE]`: exits 0 once TARGET is written; REFUSED with the reason on
stdout when the file cannot be imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

from worker.gguf.archs import Arch
from worker.gguf.header import GgufError, Tensor, read_header, shown
from worker.gguf.model import GROUP_SIZE, STORED_BITS, architecture, check, target

REFUSED = 2
FLOATS = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}  # (numpy has no bfloat16: its bits, viewed by MLX)
REPACKED = ("Q4_0", "Q4_1", "Q8_0")
PERMUTED = {"attn_q.weight": "num_attention_heads", "attn_k.weight": "num_key_value_heads"}


def write_tensors(source: Path, path: Path, dtype: str | None = None) -> None:
    """The tensors of the GGUF file `source` in mlx-lm's layout (`.weight`, and `.scales` / `.biases` when
    quantized) in the safetensors file `path`; with `dtype`, dequantized and cast to it."""
    header = read_header(source)
    config = check(header)
    arch = architecture(header)
    cast = getattr(mx, dtype) if dtype else None
    tensors: dict[str, mx.array] = {}
    with open(source, "rb") as file:
        for name, tensor in header.tensors.items():
            renamed = target(name, arch)
            if renamed is None:
                continue
            file.seek(tensor.start)
            raw = np.frombuffer(file.read(tensor.size), np.uint8)
            if raw.size != tensor.size:  # (the file shrank since its header was read)
                raise GgufError(f"{source.name}: its tensor {shown(name)} runs past the end of the file")
            arrays = _arrays(raw, tensor, cast, _offset(name, arch))
            heads = next((config[k] for part, k in PERMUTED.items() if name.endswith(part)), None)
            if arch.permuted and heads:
                arrays = _unpermuted(arrays, heads, config["head_dim"])
            stem = renamed.removesuffix(".weight")
            tensors.update({renamed if kind == "weight" else f"{stem}.{kind}": a for kind, a in arrays.items()})
    mx.save_safetensors(str(path), tensors, metadata={"format": "mlx"})


def _offset(name: str, arch: Arch) -> float:
    """What the file adds to this tensor's values (Gemma's norms: 1 + w, where mlx-lm keeps w)."""
    return arch.norm_offset if name.endswith("norm.weight") and "attn_q_norm" not in name else 0.0


def _arrays(raw: np.ndarray, tensor: Tensor, cast: mx.Dtype | None, offset: float) -> dict[str, mx.array]:
    """One tensor, as mlx-lm's shape (GGUF's dims reversed): {"weight"}, or {"weight", "scales", "biases"}."""
    kind = tensor.type_name
    shape = tuple(reversed(tensor.dims))
    if kind in FLOATS:
        array = mx.array(raw.view(FLOATS[kind])).reshape(shape)
        array = array.view(mx.bfloat16) if kind == "BF16" else array
        if offset:
            array = (array.astype(mx.float32) - offset).astype(array.dtype)
        return {"weight": array if cast is None else array.astype(cast)}
    rows = int(np.prod(shape[:-1]))
    if kind in REPACKED and cast is None:
        return _repacked(raw.reshape(rows, -1), kind, shape)
    import gguf  # (llama.cpp's own numpy dequantizers; imported where they are needed)

    floats = gguf.quants.dequantize(raw.reshape(rows, -1), gguf.GGMLQuantizationType[kind])
    weight = mx.array(floats.astype(np.float32)).reshape(shape)
    if cast is not None:
        return {"weight": weight.astype(cast)}
    quantized, scales, biases = mx.quantize(weight.astype(mx.float16), GROUP_SIZE, STORED_BITS[kind])
    return {"weight": quantized, "scales": scales, "biases": biases}


def _repacked(blocks: np.ndarray, kind: str, shape: tuple[int, ...]) -> dict[str, mx.array]:
    """Q4_0, Q4_1 or Q8_0 rows as MLX's affine weights, exactly: each block of 32 is a group whose value is
    scale * q + bias (Q4_0: d * (q - 8); Q4_1: d * q + m; Q8_0: d * q with q signed), packed as MLX packs them (the
    first value in the lowest bits of a little-endian uint32)."""
    rows = blocks.shape[0]
    blocks = blocks.reshape(rows, -1, {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[kind])
    d = np.ascontiguousarray(blocks[..., 0:2]).view("<f2")[..., 0]
    q: np.ndarray  # each value's code: uint8, or a nibble in the blocks' type
    if kind == "Q8_0":
        q = (np.ascontiguousarray(blocks[..., 2:34]).view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        bias, packed = d * np.float16(-128), q.reshape(rows, -1)
    else:
        qs = blocks[..., 4:20] if kind == "Q4_1" else blocks[..., 2:18]
        q = np.concatenate([qs & 15, qs >> 4], axis=-1).reshape(rows, -1)  # a block: its low nibbles, then high
        bias = np.ascontiguousarray(blocks[..., 2:4]).view("<f2")[..., 0] if kind == "Q4_1" else d * np.float16(-8)
        packed = q[:, 0::2] | (q[:, 1::2] << 4)
    weight = np.ascontiguousarray(packed).view("<u4").reshape(*shape[:-1], -1)
    groups = (*shape[:-1], -1)
    return {"weight": mx.array(weight), "scales": mx.array(d).reshape(groups), "biases": mx.array(bias).reshape(groups)}


def _unpermuted(arrays: dict[str, mx.array], heads: int, head_dim: int) -> dict[str, mx.array]:
    """Q or K rows back from llama.cpp's interleaved rope order (its permute(): each head's two halves' rows taken
    in turn) to the halves mlx-lm's rope expects; a quantized weight's rows move with their scales and biases."""
    order = mx.array(np.arange(heads * head_dim).reshape(heads, head_dim // 2, 2).swapaxes(1, 2).reshape(-1))
    return {kind: mx.take(array, order, axis=0) for kind, array in arrays.items()}


def main() -> None:
    source, path, *dtype = sys.argv[1:]
    try:
        write_tensors(Path(source), Path(path), dtype[0] if dtype else None)
    except GgufError as exc:
        print(exc)
        sys.exit(REFUSED)


if __name__ == "__main__":
    main()
