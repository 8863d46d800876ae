"""A GGUF model's tokenizer as transformers writes it (tokenizer.json, tokenizer_config.json with the chat template),
from the vocabulary the file carries (checked by worker/gguf/model.py): byte-level BPE built here and split as the
file's `tokenizer.ggml.pre` says (GPT-2's regex, SmolLM's digits, or the regex transformers keeps for that name:
Qwen 2's, Llama 3's…); SentencePiece by transformers' own GGUF builders, which know Gemma's and Phi-3's quirks.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from worker.gguf.header import GgufError, Header, shown

logger = logging.getLogger(__name__)

CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values of special tokens
GPT2_SPLITS = ("gpt2", "default", "smollm")  # tokenizer.ggml.pre values whose splitting is GPT-2's byte level
QUIET = "TRANSFORMERS_NO_ADVISORY_WARNINGS"  # (its import's "PyTorch was not found" is such an advice)


def write_tokenizer(header: Header, folder: Path, arch: str) -> None:
    """tokenizer.json and tokenizer_config.json for the file's vocabulary, in `folder`."""
    _import_transformers_quietly()
    from transformers import PreTrainedTokenizerFast

    meta = header.metadata
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    spm = meta["tokenizer.ggml.model"] == "llama"
    backend = _sentencepiece(meta, arch) if spm else _byte_level(meta)

    def token(kind: str) -> str | None:
        value = meta.get(f"tokenizer.ggml.{kind}_token_id")
        return tokens[value] if value is not None else None

    template = meta.get("tokenizer.chat_template")
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=token("bos"),
        eos_token=token("eos"),
        unk_token=token("unknown"),
        pad_token=token("padding"),
        chat_template=template,
        model_max_length=meta.get(f"{arch}.context_length", 4096),
    )
    wrapped.save_pretrained(str(folder))
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"  # (transformers 5 writes a class older loaders lack)
    if template:
        config["chat_template"] = template
    # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise
    config["add_bos_token"] = bool(meta.get("tokenizer.ggml.add_bos_token", spm))
    config_file.write_text(json.dumps(config, indent=2))


def _import_transformers_quietly() -> None:
    """Import transformers with its advice (no PyTorch here, which onelane never needs) unsaid, and leave the
    environment as it was."""
    if "transformers" in sys.modules:
        return
    saved = os.environ.get(QUIET)
    os.environ[QUIET] = "1"
    try:
        import transformers  # noqa: F401
    finally:
        if saved is None:
            del os.environ[QUIET]
        else:
            os.environ[QUIET] = saved


def _byte_level(meta: dict[str, Any]) -> Any:
    """Byte-level BPE from the vocabulary and merges, split as `tokenizer.ggml.pre` names."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    types = meta.get("tokenizer.ggml.token_type") or [0] * len(tokens)
    bpe = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    pre = meta.get("tokenizer.ggml.pre") or "default"
    split = _splits().get(pre)
    if split is not None:
        splits = [pre_tokenizers.Split(Regex(split), behavior="isolated"), pre_tokenizers.ByteLevel(False, False)]
    else:
        if pre not in GPT2_SPLITS:
            logger.warning("tokenizer pre-processing %s is read as GPT-2's byte-level splitting", shown(pre))
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
    return bpe


def _splits() -> dict[str, str]:
    """transformers' regexes for llama.cpp's pre-tokenizer names (none with a transformers that lacks the table)."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
    except ImportError:
        return {}
    return dict(GGUF_PRE_TOKENIZER_SPLITS)


def _sentencepiece(meta: dict[str, Any], arch: str) -> Any:
    """SentencePiece, as transformers builds it from a GGUF's vocabulary (its merges made from the scores)."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer
    except ImportError:
        raise GgufError("its SentencePiece tokenizer needs transformers 5 or later to be built") from None
    keys = {"model": "tokenizer_type", "pre": "pre_tokenizer_type", "tokens": "tokens", "scores": "scores",
            "token_type": "token_type", "merges": "merges", "add_space_prefix": "add_prefix_space"}  # fmt: skip
    described = {name: meta[f"tokenizer.ggml.{key}"] for key, name in keys.items() if f"tokenizer.ggml.{key}" in meta}
    backend, _ = convert_gguf_tokenizer(arch, described)
    return backend
