"""What a GGUF must hold to be imported, checked on its header before anything reads its tensors: a model of one of
the architectures in worker/gguf/archs.py, and mlx-lm's config.json for it, built from what was checked.

A model is its metadata's shape (width, layers, heads) and one tensor per part of each layer, every one of the shape
that metadata gives; a vocabulary as long as its embedding, merges of its own tokens, special tokens within it.
A file that says otherwise is refused in words here, rather than failing later inside mlx-lm, tokenizers (whose
BPE panics on a merge of unknown tokens), numpy or MLX.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from worker.gguf.archs import ARCHS, SKIPPED, Arch, extras, positive, sizes, whole
from worker.gguf.header import GgufError, Header, described, shown

GROUP_SIZE = 32  # MLX's group of the stored quantized weights: the block of Q4_0, Q4_1, Q8_0, a K-quant's sub-block
#: The bits each quantized type is stored in as MLX affine weights: Q4_0, Q4_1 and Q8_0 exactly as they are (their
#: blocks are affine groups of 32 already); the others requantized by MLX from their dequantized values. MLX's group
#: of 32 spans two of a K-quant's 16-value sub-blocks, each with a scale of its own, so a type is stored in more bits
#: than it holds where 4 lost too much (tests/test_gguf_archs.py, the largest logit's share: Q5_0 0.21 at 4 bits,
#: 0.08 at 5; Q3_K 0.26 at 4, 0.15 at 5; Q6_K 0.06 at 6, 0.016 at 8).
STORED_BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8, "Q5_0": 5, "Q5_1": 5, "Q2_K": 4, "Q3_K": 5, "Q4_K": 4, "Q5_K": 5,
               "Q6_K": 8}  # fmt: skip
LAYER = re.compile(r"blk\.(0|[1-9][0-9]*)\.([a-z_0-9]+\.(?:weight|bias))")
TOKENIZERS = ("gpt2", "llama")  # byte-level BPE; SentencePiece (Gemma, Mistral, Phi-3)
SPECIAL_IDS = ("bos", "eos", "unknown", "padding")
PAD = "tokenizer.ggml.padding_token_id"


def architecture(header: Header) -> Arch:
    """The architecture the file says it is, if onelane imports it."""
    arch = header.metadata.get("general.architecture")
    if isinstance(arch, str) and arch in ARCHS:
        return ARCHS[arch]
    found = "no architecture" if arch is None else f"its architecture is {described(arch)}"
    raise GgufError(f"{found}; onelane imports {', '.join(ARCHS)}")


def target(name: str, arch: Arch) -> str | None:
    """mlx-lm's name of a GGUF tensor, None for one mlx-lm does without."""
    layer = LAYER.fullmatch(name)
    if layer and layer[2] in arch.layer:
        return f"model.layers.{int(layer[1])}.{arch.layer[layer[2]][0]}"
    if name in arch.top:
        return arch.top[name][0]
    if name in SKIPPED:
        return None
    raise GgufError(f"its tensor {shown(name)} is not part of a {arch.name} model")


def check(header: Header) -> dict[str, Any]:
    """mlx-lm's config of the model the header describes, once all of it is checked; else a GgufError."""
    meta = header.metadata
    try:
        arch = architecture(header)
        if meta.get("tokenizer.ggml.model") not in TOKENIZERS:
            found = described(meta.get("tokenizer.ggml.model"))
            raise GgufError(
                f"its tokenizer is {found}; onelane builds byte-level BPE ('gpt2') and SentencePiece ('llama') ones"
            )
        config = _config(meta, arch)
        config["tie_word_embeddings"] = "output.weight" not in header.tensors
        _check_vocabulary(meta, config)
        _check_tensors(header, arch, config)
    except GgufError as exc:
        raise GgufError(f"{header.name}: {exc}") from None
    quantization = _quantization(header, arch)
    if quantization:
        config["quantization"] = quantization
    return config


def _config(meta: dict[str, Any], arch: Arch) -> dict[str, Any]:
    """mlx-lm's config from the file's `ARCH.*` metadata, each number within what such a model can be."""
    key = arch.name
    hidden = whole(meta, f"{key}.embedding_length")
    heads = whole(meta, f"{key}.attention.head_count")
    kv_heads = whole(meta, f"{key}.attention.head_count_kv", heads)
    if f"{key}.attention.key_length" in meta and not arch.width_heads:
        head_dim = whole(meta, f"{key}.attention.key_length")  # Qwen 3, Gemma 7B: not width / heads
    elif hidden % heads:
        raise GgufError(f"its embedding length {hidden} does not divide among its {heads} attention heads")
    else:
        head_dim = hidden // heads
    if heads % kv_heads:
        raise GgufError(f"its {heads} attention heads do not divide among its {kv_heads} key-value heads")
    tokens = meta.get("tokenizer.ggml.tokens")
    config = {
        "model_type": arch.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": whole(meta, f"{key}.block_count"),
        "intermediate_size": whole(meta, f"{key}.feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": positive(meta, f"{key}.attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": positive(meta, f"{key}.rope.freq_base", arch.defaults.get("rope_theta", 10000.0)),
        "vocab_size": len(tokens) if isinstance(tokens, list) else 0,
        "max_position_embeddings": whole(meta, f"{key}.context_length", 4096),
        "bos_token_id": whole(meta, "tokenizer.ggml.bos_token_id", 1, least=0),
        "eos_token_id": whole(meta, "tokenizer.ggml.eos_token_id", 2, least=0),
        # (named even when absent: transformers' own default, Phi-3's 32000, may lie past a smaller vocabulary)
        "pad_token_id": whole(meta, PAD, least=0) if PAD in meta else None,
    }
    return {**config, **extras(arch, meta, config)}


def _check_vocabulary(meta: dict[str, Any], config: dict[str, Any]) -> None:
    """Tokens as text, their types one each, merges of tokens into tokens, special tokens within the vocabulary."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise GgufError(f"its vocabulary (tokenizer.ggml.tokens) is {described(tokens)}, not a list of tokens")
    vocab = len(tokens)
    types = meta.get("tokenizer.ggml.token_type")
    if types is not None and (
        not isinstance(types, list) or len(types) != vocab or not all(type(t) is int for t in types)
    ):
        raise GgufError(f"its token types (tokenizer.ggml.token_type) are {described(types)}, not one per token")
    scores = meta.get("tokenizer.ggml.scores")
    if (
        meta.get("tokenizer.ggml.model") == "llama"
        and "tokenizer.ggml.merges" not in meta
        and (not isinstance(scores, list) or len(scores) != vocab or not all(type(s) in (int, float) for s in scores))
    ):  # (SentencePiece's merges are made from them)
        raise GgufError(f"its token scores (tokenizer.ggml.scores) are {described(scores)}, not one per token")
    merges = meta.get("tokenizer.ggml.merges", [])
    if not isinstance(merges, list):
        raise GgufError(f"its merges (tokenizer.ggml.merges) are {described(merges)}, not a list")
    known = set(tokens)
    for merge in merges:
        a, _, b = merge.partition(" ") if isinstance(merge, str) else ("", "", "")
        if not (a and b and a in known and b in known and a + b in known):
            raise GgufError(f"its merge {described(merge)} is not of two tokens of its vocabulary into a third")
    for kind in SPECIAL_IDS:
        key = f"tokenizer.ggml.{kind}_token_id"
        token = config.get(f"{kind}_token_id") if key not in meta else whole(meta, key, least=0)
        if token is not None and token >= vocab:
            raise GgufError(f"its {key} {token} is not in its vocabulary of {vocab} tokens")
    for key, expected in (("tokenizer.chat_template", str), ("tokenizer.ggml.pre", str), ("tokenizer.ggml.add_bos_token", bool)):  # fmt: skip
        if key in meta and not isinstance(meta[key], expected):
            raise GgufError(f"its {key} is {described(meta[key])}")


def _check_tensors(header: Header, arch: Arch, config: dict[str, Any]) -> None:
    """Every tensor a part of the model, every part of every layer there, each of the shape the config gives."""
    embedding, vocab = header.tensors.get("token_embd.weight"), config["vocab_size"]
    if embedding is None:
        raise GgufError("it has no token_embd tensor")
    if embedding.dims[-1] != vocab:
        raise GgufError(f"its vocabulary has {vocab} tokens, but its embedding (token_embd) {embedding.dims[-1]} rows")
    named = sizes(config)
    layers: dict[int, set[str]] = {}
    for name, tensor in header.tensors.items():
        if name in SKIPPED:
            continue
        target(name, arch)  # (a GgufError for a tensor that is no part)
        layer = LAYER.fullmatch(name)
        part = layer[2] if layer else name
        if layer:
            layers.setdefault(int(layer[1]), set()).add(part)
        expected = tuple(named[size] for size in (arch.layer if layer else arch.top)[part][1])
        if tensor.dims != expected:
            raise GgufError(
                f"its tensor {shown(name)} has dimensions {list(tensor.dims)}, where its metadata gives {list(expected)}"
            )
        if tensor.quantized and len(tensor.dims) == 1:
            raise GgufError(
                f"its tensor {shown(name)} is {tensor.type_name}; a {arch.name} model's norms and biases are F32, "
                "F16 or BF16"
            )
    count = config["num_hidden_layers"]
    if len(layers) != count or max(layers) != count - 1:  # (distinct numbers from 0: exactly 0 to count - 1)
        held = f"layers {min(layers)} to {max(layers)}" if layers else "no layer"
        raise GgufError(f"its {arch.name}.block_count is {count}, but it holds the tensors of {len(layers)} ({held})")
    for layer_number, parts in layers.items():
        for part in arch.layer:
            if part not in parts:
                raise GgufError(f"its layer {layer_number} has no {part.removesuffix('.weight')} tensor")
    if "output_norm.weight" not in header.tensors:
        raise GgufError("it has no output_norm tensor")


def _quantization(header: Header, arch: Arch) -> dict[str, Any]:
    """mlx-lm's quantization config of the file's quantized tensors: the commonest bits, and each other one's."""
    bits = {}
    for name, tensor in header.tensors.items():
        mlx_name = target(name, arch)
        if tensor.quantized and mlx_name is not None:
            bits[mlx_name.removesuffix(".weight")] = STORED_BITS[tensor.type_name]
    if not bits:
        return {}
    common = Counter(bits.values()).most_common(1)[0][0]
    quantization: dict[str, Any] = {"group_size": GROUP_SIZE, "bits": common}
    for layer, b in bits.items():  # a file mixes types: Q4_K_M holds Q4_K and Q6_K tensors
        if b != common:
            quantization[layer] = {"group_size": GROUP_SIZE, "bits": b}
    return quantization
