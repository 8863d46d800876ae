"""Each token's bytes, as a log probability's entry names it: what the token adds to the text, in UTF-8 (a token may
hold only part of a character). Read from the tokenizer's own vocabulary, the way mlx-lm's streaming detokenizers
read it: byte-level BPE maps characters back to bytes, SentencePiece writes a space as "▁" and a byte as "<0xAB>"."""

from __future__ import annotations

import functools
from typing import Any

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer

SPM_SPACE = "\u2581".encode()


@functools.cache
def _bpe_bytes() -> dict[str, int]:
    """GPT-2's byte-level alphabet, read backwards: the printable bytes stand for themselves, the others for
    the characters from U+0100 on, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in table.values()]
    table.update({chr(256 + n): b for n, b in enumerate(others)})
    return table


class TokenBytes:
    """Token id -> its bytes, for one tokenizer (computed on first use, then kept)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        detokenizer = tokenizer.detokenizer
        self._map: list[Any] | None = getattr(detokenizer, "tokenmap", None)
        self._kind = (
            "bpe"
            if isinstance(detokenizer, BPEStreamingDetokenizer)
            else "spm"
            if isinstance(detokenizer, SPMStreamingDetokenizer)
            else "text"
        )
        self._known: dict[int, bytes] = {}

    def __getitem__(self, token: int) -> bytes:
        found = self._known.get(token)
        if found is None:
            found = self._known[token] = self._read(token)
        return found

    def _read(self, token: int) -> bytes:
        if self._map is None or token >= len(self._map):
            return self._tokenizer.decode([token]).encode()  # type: ignore[no-any-return]  # (mlx-lm's tokenizer wrapper and its tokenmap are untyped)
        raw = self._map[token]
        if self._kind == "spm":
            return raw.replace(SPM_SPACE, b" ")  # type: ignore[no-any-return]  # (mlx-lm's tokenizer wrapper and its tokenmap are untyped)
        if self._kind == "bpe":
            table = _bpe_bytes()
            return b"".join(bytes([table[c]]) if c in table else c.encode() for c in raw)
        return self._tokenizer.decode([token]).encode()  # type: ignore[no-any-return]  # (mlx-lm's tokenizer wrapper and its tokenmap are untyped)
