"""Log probabilities as the worker records them and the web reads them back: one entry per token.

An entry is compact JSON, `[bytes as hex, logprob, [[bytes as hex, logprob], ...]]`: the token's UTF-8 bytes (a
token may hold part of a character), its log probability, then the likeliest tokens at its place, likeliest first.
A token that is no text (the end of sequence) has the entry `null`. A job's generated tokens' entries are a string,
each followed by a newline (keys.logprobs), in step with the tokens counted; its prompt's are one JSON list.
"""

from __future__ import annotations

import builtins
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One token: its bytes, its log probability (None: the prompt's first token, which nothing predicts), and the
    likeliest tokens at its place."""

    bytes: bytes
    logprob: float | None
    top: tuple[tuple[builtins.bytes, float], ...] = ()  # (`bytes` here is the field above)

    def encode(self) -> str:
        return json.dumps([self.bytes.hex(), self.logprob, [[b.hex(), lp] for b, lp in self.top]])

    @classmethod
    def decode(cls, raw: Any) -> TokenLogprob | None:
        """From an entry (its JSON, or that JSON parsed); None for a token that is no text."""
        value = json.loads(raw) if isinstance(raw, str) else raw
        if value is None:
            return None
        hexed, logprob, top = value
        return cls(bytes.fromhex(hexed), logprob, tuple((bytes.fromhex(b), lp) for b, lp in top))

    @property
    def token(self) -> str:
        return token_text(self.bytes)


def token_text(raw: bytes) -> str:
    """A token's text, as OpenAI shows it: its characters, or `bytes:\\xe2\\x80` for bytes that are part of one."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def read_entries(text: str) -> list[TokenLogprob]:
    """A job's generated tokens' entries (keys.logprobs' string, or a token event's part of it), the text-less
    tokens left out."""
    entries = (TokenLogprob.decode(line) for line in text.split("\n") if line)
    return [e for e in entries if e is not None]


def read_prompt(text: str) -> list[TokenLogprob]:
    """A job's prompt tokens' entries, as the worker recorded them (one JSON list)."""
    return [e for e in (TokenLogprob.decode(v) for v in json.loads(text or "[]")) if e is not None]
