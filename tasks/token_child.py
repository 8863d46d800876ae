"""The token counter's own process: a prompt's tokens as its model reads them, counted with the model's tokenizer
(transformers', as mlx-lm loads it, without MLX) and its chat template, as the worker renders it
(tasks/chat_prompt.py). Run as tasks/children.py runs its children; tasks/token_count.py asks it.

Tokenizers are native code, and a long prompt costs CPU: here that is this process's, not the web's gevent loop's.
Its memory is capped (MEMORY_BYTES), and each count's CPU time (CPU_S).

A request's header is `{"folder": ..., "options": {...}}` (the model's folder and its tokenizer's load options), its
payload a JobSpec's JSON (none: load the tokenizer only, to warm it); the answer is `{"tokens": n}` or
`{"error": why, "tokenizer": whether the tokenizer loaded}`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from tasks.children import serve

MEMORY_BYTES = 4 * 1024**3  # address space: a tokenizer and a prompt fit in far less
CPU_S = 10  # a count's CPU time, at most
KEPT = 8  # tokenizers kept (of the models counted last)

_tokenizers: dict[str, Any] = {}


def main() -> None:
    logging.disable(logging.WARNING)  # (transformers' advice about PyTorch has no reader here)
    serve(lambda header, payload: (_answer(header, payload), b""), MEMORY_BYTES, CPU_S)


def _answer(header: dict[str, Any], payload: bytes) -> dict[str, Any]:
    try:
        tokenizer = _tokenizer(str(header["folder"]), dict(header.get("options") or {}))
    except Exception as exc:  # (the worker counts again as the job joins: it is only refused later)
        return {"error": f"{type(exc).__name__}: {exc}"[:500], "tokenizer": False}
    try:
        return {"tokens": count(tokenizer, payload.decode()) if payload else 0}
    except Exception as exc:  # (a template that refuses this conversation, say: the worker says so)
        return {"error": f"{type(exc).__name__}: {exc}"[:500], "tokenizer": True}


def _tokenizer(folder: str, options: dict[str, Any]) -> Any:
    key = json.dumps([folder, options], sort_keys=True)
    if key not in _tokenizers:
        from transformers import AutoTokenizer

        while len(_tokenizers) >= KEPT:
            _tokenizers.pop(next(iter(_tokenizers)))
        _tokenizers[key] = AutoTokenizer.from_pretrained(folder, **options)
    return _tokenizers[key]


def count(tokenizer: Any, spec_json: str) -> int:
    """The tokens of a job's prompt (its spec's JSON), rendered as the worker renders it (Engine.prompt_tokens)."""
    from tasks.chat_prompt import chat_input
    from tasks.job import JobSpec

    spec = JobSpec.model_validate_json(spec_json)
    if spec.messages is None:
        return len(tokenizer.encode(spec.prompt or ""))
    messages, tools = chat_input(spec.messages, spec.tools, tokenizer)
    extra = {"tools": tools} if tools else {}
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False, **extra)
    return len(ids)


if __name__ == "__main__":
    main()
