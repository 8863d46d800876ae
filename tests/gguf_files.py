"""GGUF files written byte by byte, for the stories that feed onelane hostile ones: a tiny llama model that imports,
and the parts to write it wrong (a count, a length, a type, a name) where a reader must not trust the file.

The layout is GGUF's (ggml's docs/gguf.md): magic, version, tensor count, metadata count; each metadata entry's key
(uint64 length + bytes), value type and value; each tensor's name, dimensions, type and offset; then the tensor data,
aligned to 32 bytes."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
F32, F16 = 0, 1
ALIGNMENT = 32
SCALAR = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f", BOOL: "<?",
          UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}  # fmt: skip
LAYER = ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
TOKENS = ["a", "b", "c", "ab", "abc", "Ġ", "<|im_start|>", "<|im_end|>"]  # byte-level BPE: "a b", then "ab c"


def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def string(text: str | bytes, length: int | None = None) -> bytes:
    """A GGUF string: its length (or a `length` that lies about it), then its bytes."""
    raw = text.encode() if isinstance(text, str) else text
    return u64(len(raw) if length is None else length) + raw


def value(kind: int, v: Any) -> bytes:
    """A metadata value of the type `kind` (an ARRAY is (element type, [values]))."""
    if kind == STRING:
        return string(v)
    if kind == ARRAY:
        element, items = v
        return u32(element) + u64(len(items)) + b"".join(value(element, item) for item in items)
    return struct.pack(SCALAR[kind], v)


def entry(key: str | bytes, kind: int, v: Any) -> bytes:
    return string(key) + u32(kind) + value(kind, v)


def tensor_info(name: str, dims: list[int], kind: int, offset: int, n_dims: int | None = None) -> bytes:
    """A tensor's record: dims in GGUF's order (the fastest-moving first)."""
    return (
        string(name) + u32(len(dims) if n_dims is None else n_dims) + b"".join(map(u64, dims)) + u32(kind) + u64(offset)
    )


def header(n_tensors: int, n_entries: int, version: int = 3, magic: bytes = b"GGUF") -> bytes:
    return magic + u32(version) + u64(n_tensors) + u64(n_entries)


def metadata(layers: int = 2, vocab: list[str] = TOKENS, **changes: Any) -> dict[str, tuple[int, Any]]:
    """A tiny llama's metadata: width 32, 2 heads (1 for K and V) of 16, 2 layers, the 8 tokens of TOKENS.
    `changes` replace entries by key (dots as double underscores: llama__block_count=(UINT32, 9)); None drops one."""
    meta: dict[str, tuple[int, Any]] = {
        "general.architecture": (STRING, "llama"),
        "general.file_type": (UINT32, 0),
        "llama.embedding_length": (UINT32, 32),
        "llama.block_count": (UINT32, layers),
        "llama.feed_forward_length": (UINT32, 64),
        "llama.attention.head_count": (UINT32, 2),
        "llama.attention.head_count_kv": (UINT32, 1),
        "llama.context_length": (UINT32, 256),
        "llama.attention.layer_norm_rms_epsilon": (FLOAT32, 1e-5),
        "tokenizer.ggml.model": (STRING, "gpt2"),
        "tokenizer.ggml.tokens": (ARRAY, (STRING, vocab)),
        "tokenizer.ggml.token_type": (ARRAY, (INT32, [3 if t.startswith("<|") else 1 for t in vocab])),
        "tokenizer.ggml.merges": (ARRAY, (STRING, ["a b", "ab c"])),
        "tokenizer.ggml.bos_token_id": (UINT32, 6),
        "tokenizer.ggml.eos_token_id": (UINT32, 7),
        "tokenizer.chat_template": (STRING, "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"),
    }
    for key, change in changes.items():
        key = key.replace("__", ".")
        if change is None:
            meta.pop(key, None)
        else:
            meta[key] = change
    return meta


def tensors(layers: int = 2, vocab: int = len(TOKENS)) -> dict[str, list[int]]:
    """The tiny llama's tensors and their dims (GGUF's order: input width first)."""
    shapes = {"token_embd.weight": [32, vocab], "output_norm.weight": [32]}
    parts = {"attn_norm": [32], "ffn_norm": [32], "attn_q": [32, 32], "attn_k": [32, 16], "attn_v": [32, 16],
             "attn_output": [32, 32], "ffn_gate": [32, 64], "ffn_up": [32, 64], "ffn_down": [64, 32]}  # fmt: skip
    for layer in range(layers):
        shapes.update({f"blk.{layer}.{part}.weight": dims for part, dims in parts.items()})
    return shapes


def llama_gguf(
    meta: dict[str, tuple[int, Any]] | None = None, shapes: dict[str, list[int]] | None = None, seed: int = 0
) -> bytes:
    """A whole, valid GGUF of the tiny llama (F32 weights), or of the metadata and tensors given."""
    meta = metadata() if meta is None else meta
    shapes = tensors() if shapes is None else shapes
    rng = np.random.default_rng(seed)
    infos, data = [], b""
    for name, dims in shapes.items():
        infos.append(tensor_info(name, dims, F32, len(data)))
        weights = rng.normal(0, 0.02, int(np.prod(dims))).astype("<f4")
        if name.endswith("norm.weight"):
            weights[:] = 1.0
        data += weights.tobytes()
        data += b"\0" * (-len(data) % ALIGNMENT)
    head = header(len(shapes), len(meta)) + b"".join(entry(k, kind, v) for k, (kind, v) in meta.items())
    head += b"".join(infos)
    return head + b"\0" * (-len(head) % ALIGNMENT) + data
