"""What a llama-family GGUF must hold to be imported, checked on its header before anything reads its tensors; and the
folder's config.json and tokenizer, built from what was checked.

A llama model is its metadata's shape (width, layers, heads) and one tensor per part of each layer, every one of the
shape that metadata gives; a vocabulary as long as its embedding, merges of its own tokens, special tokens within it.
A file that says otherwise is refused in words here, rather than failing later inside mlx-lm, tokenizers (whose
BPE panics on a merge of unknown tokens) or MLX.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

from worker.gguf_header import GgufError, Header, described, shown

logger = logging.getLogger(__name__)

#: general.file_type: the tensor types MLX reads (llama.cpp's llama_ftype numbers)
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0"}
GROUP_SIZE = 32  # the block of llama.cpp's Q4_0, Q4_1 and Q8_0
BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}
LAYER_PARTS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_PARTS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
SKIPPED = "rope_freqs"  # precomputed rope frequencies: mlx-lm computes its own
LAYER = re.compile(r"blk\.(0|[1-9][0-9]*)\.([a-z_]+)")
CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values of special tokens
PRE_TOKENIZERS = ("gpt2", "default", "smollm")  # tokenizer.ggml.pre values whose splitting is GPT-2's byte level
SPECIAL_IDS = ("bos", "eos", "unknown", "padding")


def target(stem: str) -> str | None:
    """mlx-lm's name of a GGUF tensor (without its `.weight`), None for one mlx-lm does without."""
    layer = LAYER.fullmatch(stem)
    if layer and layer[2] in LAYER_PARTS:
        return f"model.layers.{int(layer[1])}.{LAYER_PARTS[layer[2]]}"
    if stem in TOP_PARTS:
        return TOP_PARTS[stem]
    if stem == SKIPPED:
        return None
    raise GgufError(f"its tensor {shown(stem)} is not part of a llama model")


def check(header: Header) -> dict[str, Any]:
    """mlx-lm's config of the llama model the header describes, once all of it is checked; else a GgufError."""
    meta, name = header.metadata, header.name
    try:
        arch = meta.get("general.architecture")
        if arch != "llama":
            found = "no architecture" if arch is None else f"its architecture is {described(arch)}"
            raise GgufError(f"{found}; onelane imports llama-family GGUFs only")
        file_type = _whole(meta, "general.file_type", 0, least=0)
        if file_type not in FILE_TYPES:
            raise GgufError(
                f"its tensor type (llama.cpp file type {file_type}) is not one MLX reads; "
                f"use a {', '.join(FILE_TYPES.values())} file (a K-quant such as Q4_K_M is not)"
            )
        if meta.get("tokenizer.ggml.model") != "gpt2":
            found = described(meta.get("tokenizer.ggml.model"))
            raise GgufError(f"its tokenizer is {found}; onelane builds byte-level BPE tokenizers ('gpt2') only")
        config = _config(meta)
        config["tie_word_embeddings"] = "output.weight" not in header.tensors
        _check_vocabulary(meta, config)
        _check_tensors(header, config)
    except GgufError as exc:
        raise GgufError(f"{name}: {exc}") from None
    quantization = _quantization(header)
    if quantization:
        config["quantization"] = quantization
    return config


def _config(meta: dict[str, Any]) -> dict[str, Any]:
    """mlx-lm's llama config from the file's `llama.*` metadata, each number within what a llama model can be."""
    hidden = _whole(meta, "llama.embedding_length")
    heads = _whole(meta, "llama.attention.head_count")
    kv_heads = _whole(meta, "llama.attention.head_count_kv", heads)
    if hidden % heads:
        raise GgufError(f"its embedding length {hidden} does not divide among its {heads} attention heads")
    if heads % kv_heads:
        raise GgufError(f"its {heads} attention heads do not divide among its {kv_heads} key-value heads")
    tokens = meta.get("tokenizer.ggml.tokens")
    return {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": _whole(meta, "llama.block_count"),
        "intermediate_size": _whole(meta, "llama.feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": _whole(meta, "llama.rope.dimension_count", hidden // heads),
        "rms_norm_eps": _positive(meta, "llama.attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": _positive(meta, "llama.rope.freq_base", 10000.0),
        "rope_traditional": True,  # Q and K rows are stored for interleaved RoPE (see worker/gguf.py)
        "vocab_size": len(tokens) if isinstance(tokens, list) else 0,
        "max_position_embeddings": _whole(meta, "llama.context_length", 4096),
        "bos_token_id": _whole(meta, "tokenizer.ggml.bos_token_id", 1, least=0),
        "eos_token_id": _whole(meta, "tokenizer.ggml.eos_token_id", 2, least=0),
    }


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
        token = config.get(f"{kind}_token_id") if key not in meta else _whole(meta, key, least=0)
        if token is not None and token >= vocab:
            raise GgufError(f"its {key} {token} is not in its vocabulary of {vocab} tokens")
    for key, kind in (("tokenizer.chat_template", str), ("tokenizer.ggml.pre", str), ("tokenizer.ggml.add_bos_token", bool)):  # fmt: skip
        if key in meta and not isinstance(meta[key], kind):
            raise GgufError(f"its {key} is {described(meta[key])}")


def _check_tensors(header: Header, config: dict[str, Any]) -> None:
    """Every tensor a part of a llama model, every part of every layer there, each of the shape the config gives."""
    embedding, vocab = header.tensors.get("token_embd.weight"), config["vocab_size"]
    if embedding is None:
        raise GgufError("it has no token_embd tensor")
    if embedding.dims[-1] != vocab:
        raise GgufError(f"its vocabulary has {vocab} tokens, but its embedding (token_embd) {embedding.dims[-1]} rows")
    layers: dict[int, set[str]] = {}
    for name, tensor in header.tensors.items():
        stem = name.removesuffix(".weight")
        layer = LAYER.fullmatch(stem)
        part = layer[2] if layer else stem
        if stem == SKIPPED:
            continue
        if stem == name or part not in (LAYER_PARTS if layer else TOP_PARTS):
            raise GgufError(f"its tensor {shown(name)} is not part of a llama model")
        if layer:
            layers.setdefault(int(layer[1]), set()).add(part)
        expected = _shape(part, config)
        if tensor.dims != expected:
            raise GgufError(
                f"its tensor {shown(name)} has dimensions {list(tensor.dims)}, where its metadata gives {list(expected)}"
            )
        if tensor.quantized and len(tensor.dims) == 1:
            raise GgufError(f"its tensor {shown(name)} is {tensor.type_name}; a llama model's norms are F32 or F16")
    count = config["num_hidden_layers"]
    if len(layers) != count or max(layers) != count - 1:  # (distinct numbers from 0: exactly 0 to count - 1)
        held = f"layers {min(layers)} to {max(layers)}" if layers else "no layer"
        raise GgufError(f"its llama.block_count is {count}, but it holds the tensors of {len(layers)} ({held})")
    for layer, parts in layers.items():
        for part in LAYER_PARTS:
            if part not in parts:
                raise GgufError(f"its layer {layer} has no {part} tensor")
    if "output_norm.weight" not in header.tensors:
        raise GgufError("it has no output_norm tensor")


def _shape(part: str, config: dict[str, Any]) -> tuple[int, ...]:
    """A part's dims in GGUF's order (its input width first)."""
    hidden, ff, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    return {
        "token_embd": (hidden, vocab),
        "output": (hidden, vocab),
        "output_norm": (hidden,),
        "attn_norm": (hidden,),
        "ffn_norm": (hidden,),
        "attn_q": (hidden, q),
        "attn_k": (hidden, kv),
        "attn_v": (hidden, kv),
        "attn_output": (q, hidden),
        "ffn_gate": (hidden, ff),
        "ffn_up": (hidden, ff),
        "ffn_down": (ff, hidden),
    }[part]


def _quantization(header: Header) -> dict[str, Any]:
    """mlx-lm's quantization config of the file's quantized tensors: the commonest bits, and each other one's."""
    bits = {}
    for name, tensor in header.tensors.items():
        mlx_name = target(name.removesuffix(".weight"))
        if tensor.quantized and mlx_name is not None:
            bits[mlx_name] = BITS[tensor.type_name]
    if not bits:
        return {}
    common = Counter(bits.values()).most_common(1)[0][0]
    quantization: dict[str, Any] = {"group_size": GROUP_SIZE, "bits": common}
    for layer, b in bits.items():  # a file may mix Q4 and Q8 tensors
        if b != common:
            quantization[layer] = {"group_size": GROUP_SIZE, "bits": b}
    return quantization


def _whole(meta: dict[str, Any], key: str, default: int | None = None, least: int = 1) -> int:
    value = meta.get(key, default)
    if value is None:
        raise GgufError(f"its metadata has no {key}")
    if type(value) is not int:
        raise GgufError(f"its {key} is {described(value)}, not a whole number")
    if value < least:
        raise GgufError(f"its {key} is {value}; a llama model's is at least {least}")
    return value


def _positive(meta: dict[str, Any], key: str, default: float) -> float:
    value = meta.get(key, default)
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise GgufError(f"its {key} is {described(value)}, not a positive number")
    return float(value)


def write_tokenizer(header: Header, folder: Path) -> None:
    """tokenizer.json and tokenizer_config.json, as transformers writes them, from the file's byte-level BPE (checked:
    see `check`)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    meta = header.metadata
    pre = meta.get("tokenizer.ggml.pre") or "default"
    if pre not in PRE_TOKENIZERS:
        logger.warning("tokenizer pre-processing %s is read as GPT-2's byte-level splitting", shown(pre))
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    types = meta.get("tokenizer.ggml.token_type") or [0] * len(tokens)
    bpe = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    splits = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if pre == "smollm":  # SmolLM's tokenizer reads every digit alone
        splits.insert(0, pre_tokenizers.Digits(individual_digits=True))
    bpe.pre_tokenizer = pre_tokenizers.Sequence(splits)
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, kind in zip(tokens, types)
            if kind in (CONTROL, USER_DEFINED)
        ]
    )

    def token(kind: str) -> str | None:
        value = meta.get(f"tokenizer.ggml.{kind}_token_id")
        return tokens[value] if value is not None else None

    template = meta.get("tokenizer.chat_template")
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=token("bos"),
        eos_token=token("eos"),
        unk_token=token("unknown"),
        pad_token=token("padding"),
        chat_template=template,
        model_max_length=meta.get("llama.context_length", 4096),
    )
    wrapped.save_pretrained(str(folder))
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"  # (transformers 5 writes a class older loaders lack)
    if template:
        config["chat_template"] = template
    config["add_bos_token"] = bool(meta.get("tokenizer.ggml.add_bos_token"))
    config_file.write_text(json.dumps(config, indent=2))
