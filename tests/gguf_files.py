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


# --- tiny models of each architecture, as llama.cpp's converter writes them (with the gguf package's GGUFWriter) ---
# Written from HF-named float weights, independently of worker/gguf/archs.py: the names below are llama.cpp's
# (gguf-py's tensor_mapping.py) and mlx-lm's, the conversions convert_hf_to_gguf.py's.

ATTENTION = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj"}  # fmt: skip
MLP = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
LAYERS = {
    "llama": {**NORMS, **ATTENTION, **MLP},
    "qwen2": {**NORMS, **ATTENTION, **MLP},  # (and Q, K, V biases)
    "qwen3": {**NORMS, **ATTENTION, **MLP, "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
    "gemma": {**NORMS, **ATTENTION, **MLP},
    "gemma2": {
        "attn_norm": "input_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
        **ATTENTION,
        **MLP,
    },  # fmt: skip
    "phi3": {
        **NORMS,
        "attn_qkv": "self_attn.qkv_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_up": "mlp.gate_up_proj",
        "ffn_down": "mlp.down_proj",
    },  # fmt: skip
}
LAYERS["mistral"] = LAYERS["llama"]
BYTE_LEVEL = [*"abcdefghijklmnopqrstuvwxyz", "Ġ", "ab", "Ġa", "<|im_start|>", "<|im_end|>"]
PIECES = ["<unk>", "<s>", "</s>", "▁", *"abcdefghijklmnopqrstuvwxyz", "▁a", "▁b", "ab", "▁ab"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"


def hf_config(arch: str, hidden: int = 64, ff: int = 128, heads: int = 4, kv_heads: int = 2, vocab: int = 64) -> dict:
    """mlx-lm's config of a tiny model of `arch`: 2 layers, heads of hidden / heads (Qwen 3 and Gemma: of 32)."""
    head_dim = 32 if arch in ("qwen3", "gemma", "gemma2") else hidden // heads
    config = {"model_type": {"mistral": "llama"}.get(arch, arch), "hidden_size": hidden, "num_hidden_layers": 2,
              "intermediate_size": ff, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "head_dim": head_dim, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": vocab,
              "max_position_embeddings": 256, "tie_word_embeddings": arch in ("qwen2", "gemma", "gemma2")}  # fmt: skip
    if arch == "gemma2":
        config.update(attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=head_dim)
    return config


def hf_weights(arch: str, config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights under mlx-lm's names, in its (out, in) shapes."""
    rng = np.random.default_rng(seed)
    hidden, ff, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    shapes = {"self_attn.q_proj": (q, hidden), "self_attn.k_proj": (kv, hidden), "self_attn.v_proj": (kv, hidden),
              "self_attn.o_proj": (hidden, q), "self_attn.qkv_proj": (q + 2 * kv, hidden), "mlp.gate_proj": (ff, hidden),
              "mlp.up_proj": (ff, hidden), "mlp.gate_up_proj": (2 * ff, hidden), "mlp.down_proj": (hidden, ff),
              "self_attn.q_norm": (config["head_dim"],), "self_attn.k_norm": (config["head_dim"],)}  # fmt: skip
    weights = {"model.embed_tokens.weight": rng.normal(0, 1, (vocab, hidden)), "model.norm.weight": 1 + rng.normal(0, 0.1, hidden)}  # fmt: skip
    if not config["tie_word_embeddings"]:
        weights["lm_head.weight"] = rng.normal(0, hidden**-0.5, (vocab, hidden))
    for layer in range(config["num_hidden_layers"]):
        for part in LAYERS[arch].values():
            shape = shapes.get(part, (hidden,))
            w = 1 + rng.normal(0, 0.1, shape) if len(shape) == 1 else rng.normal(0, shape[1] ** -0.5, shape)
            weights[f"model.layers.{layer}.{part}.weight"] = w
        if arch == "qwen2":
            for part, size in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                weights[f"model.layers.{layer}.self_attn.{part}.bias"] = rng.normal(0, 0.5, size)
    return {name: w.astype(np.float32) for name, w in weights.items()}


def gguf_name(arch: str, hf: str) -> str:
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    stem, _, kind = hf.rpartition(".")
    if stem in top:
        return f"{top[stem]}.{kind}"
    _, _, layer, part = stem.split(".", 3)
    return f"blk.{layer}.{ {v: k for k, v in LAYERS[arch].items()}[part] }.{kind}"


def llama_permutation(rows: int, heads: int) -> np.ndarray:
    """llama.cpp's permute() of Q and K rows, as indices: GGUF row i is HF row order[i]."""
    return np.arange(rows).reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(-1)


def kquant_blocks(rows: int, cols: int, qtype: Any, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant rows (the gguf package dequantizes K-quants but cannot write them): random quants and
    sub-block scales, with the super-block scales (d, dmin) set so the weights' spread is about 1 / sqrt(cols)."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    fields = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}[qtype.name]
    data = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for scale in (1.0, None):
        if scale is None:
            scale = cols**-0.5 / gguf.quants.dequantize(data.reshape(rows, -1), qtype).std()
        for at in fields:
            data[..., at : at + 2] = np.array([scale], "<f2").view(np.uint8)
    return data.reshape(rows, -1)


def write_arch_gguf(
    path: Any, arch: str, config: dict, weights: dict[str, np.ndarray], types: Any = None, extra: dict | None = None
) -> dict:
    """Write `weights` (HF names) as llama.cpp's converter would for `arch`, each matrix in the ggml type
    `types(gguf_name)` gives (F32 by default; norms and biases stay F32), and the `extra` tensors as they are; returns the HF-named float32 weights the
    file holds, as the gguf package dequantizes them (what mlx-lm must be given to answer as the file does)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    if arch in ("qwen3", "gemma", "gemma2"):
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    _write_vocabulary(writer, arch, config["vocab_size"])
    rng = np.random.default_rng(1)
    held = {}
    for name, hf in weights.items():
        target = gguf_name(arch, name)
        g = hf.copy()
        if arch in ("llama", "mistral") and target.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config["num_attention_heads" if "attn_q" in target else "num_key_value_heads"]
            g = g[llama_permutation(g.shape[0], heads)]
        if arch.startswith("gemma") and target.endswith("norm.weight"):
            g = g + 1  # Gemma's norms are stored as 1 + w
        qtype = gguf.GGMLQuantizationType[types(target) if types and g.ndim == 2 else "F32"]
        if qtype.name in ("F32", "F16"):
            data = g.astype(np.float32 if qtype.name == "F32" else np.float16)
            writer.add_tensor(target, data)
            stored = data.astype(np.float32)
        else:
            data = kquant_blocks(*g.shape, qtype, rng) if qtype.name.endswith("_K") else gguf.quants.quantize(g, qtype)
            writer.add_tensor(target, data, raw_dtype=qtype)
            stored = gguf.quants.dequantize(data, qtype).astype(np.float32).reshape(g.shape)
        if arch in ("llama", "mistral") and target.endswith(("attn_q.weight", "attn_k.weight")):
            back = np.empty_like(stored)
            back[llama_permutation(g.shape[0], heads)] = stored
            stored = back
        held[name] = stored - 1 if arch.startswith("gemma") and target.endswith("norm.weight") else stored
    for name, array in (extra or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return held


def _write_vocabulary(writer: Any, arch: str, vocab: int) -> None:
    """A byte-level BPE vocabulary (SentencePiece for Gemma and Phi-3, as their files have), padded to `vocab`."""
    if arch in ("gemma", "gemma2", "phi3"):
        tokens = PIECES + [f"<unused{i}>" for i in range(vocab - len(PIECES))]
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores([-float(i) for i in range(vocab)])
        writer.add_token_types([2, 3, 3] + [1] * (len(PIECES) - 3) + [3] * (vocab - len(PIECES)))
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
    else:
        tokens = BYTE_LEVEL + [f"<|extra_{i}|>" for i in range(vocab - len(BYTE_LEVEL))]
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2" if arch.startswith("qwen") else "default")
        writer.add_token_list(tokens)
        writer.add_token_merges(["a b", "Ġ a"])
        writer.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
        writer.add_bos_token_id(BYTE_LEVEL.index("<|im_start|>"))
        writer.add_eos_token_id(BYTE_LEVEL.index("<|im_end|>"))
    writer.add_chat_template(TEMPLATE)
