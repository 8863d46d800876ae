"""The grammar checker's own process: builds and checks grammars with llguidance, one request a line.

llguidance is native code: a grammar that overflows its stack or its memory kills the process it runs in. Here that
is this process alone, which the web starts again, and the request that did it gets its 400 (tasks/grammar_check.py).
Its memory is capped (MEMORY_BYTES), and the web kills it when a check runs past its time.

A request (tasks/children.py's wire) is `{"kind": "schema" | "lark", "text": ..., "overrides": ...}` (a schema's
JSON compile options); the answer is `{"grammar": ..., "error": ...}`, exactly one of them a string.
"""

from __future__ import annotations

import random
import resource
import zlib
from typing import Any

from tasks.children import serve

MEMORY_BYTES = 2 * 1024**3  # address space: a grammar that would take more fails here, not in the web
#: how the check walks a grammar once it compiles (PROBE_WALKS walks of up to PROBE_BYTES bytes each): the parser's
#: limits (its rows) are met while reading, not while compiling, and the worker must not be the first to meet them
PROBE_WALKS = 4
PROBE_BYTES = 96
STRUCTURE = tuple(b'{}[],:"')  # a walk prefers these, to get through strings into the grammar's shape
EOS = 256


class _Bytes:
    """A tokenizer of the 256 bytes and an end: the parser's limits do not depend on the model's tokenizer."""

    eos_token_id = EOS
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
    special_token_ids = [EOS]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    import llguidance  # (after the cap: its allocations count)
    from llguidance._tokenizer import TokenizerWrapper

    tokenizer = llguidance.LLTokenizer(TokenizerWrapper(_Bytes()))
    serve(lambda request, _: (_check(llguidance, tokenizer, request), b""))


def _check(llguidance: Any, tokenizer: Any, request: dict[str, Any]) -> dict[str, str | None]:
    text = request["text"]
    try:
        if request["kind"] == "schema":
            grammar = llguidance.LLMatcher.grammar_from_json_schema(text, overrides=request.get("overrides"))
        else:
            grammar = llguidance.LLMatcher.grammar_from_lark(text)
    except (ValueError, TypeError) as exc:
        return {"grammar": None, "error": f"it cannot be read: {exc}"}
    error = llguidance.LLMatcher.validate_grammar(grammar) or _probe(llguidance, tokenizer, grammar)
    return {"grammar": None, "error": error} if error else {"grammar": grammar, "error": None}


def _probe(llguidance: Any, tokenizer: Any, grammar: str) -> str:
    """The first error met compiling `grammar` and reading a few answers it allows (each walk takes the bytes its
    mask allows, by a seed from the grammar, so that a grammar always gets the same verdict; the bytes it forces
    are taken at once); "" if none."""
    start = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    if start.is_error():
        return str(start.get_error())
    draw = random.Random(zlib.crc32(grammar.encode()))
    for _ in range(PROBE_WALKS):
        matcher, read = start.deep_copy(), 0
        while read < PROBE_BYTES and not matcher.is_stopped() and not matcher.is_error():
            if forced := matcher.compute_ff_bytes():
                matcher.consume_tokens(list(forced))
                read += len(forced)
                continue
            mask = matcher.compute_logit_bias()
            if matcher.is_error():
                break
            shaped = [t for t in STRUCTURE if mask[t]]
            allowed = shaped if shaped and draw.random() < 0.7 else [t for t, allows in enumerate(mask) if allows]
            token = draw.choice(allowed) if allowed else EOS
            if token == EOS or not matcher.consume_token(token):
                break
            read += 1
        if matcher.is_error():
            return str(matcher.get_error())
    return ""


if __name__ == "__main__":
    main()
