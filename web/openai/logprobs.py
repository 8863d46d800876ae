"""Log probabilities as OpenAI's endpoints show them, from the entries the worker records (tasks/logprobs.py).

Chat completions and the Responses API show each token as `{token, logprob, bytes, top_logprobs: [{token, logprob,
bytes}]}`; the legacy completions, as four lists side by side (`tokens`, `token_logprobs`, `top_logprobs` as
`{token: logprob}` dicts, `text_offset`). A log probability that is not a number (a token a grammar or a bias of -100
ruled out) is shown as OpenAI shows it, -9999.0: JSON has no -Infinity.
"""

from __future__ import annotations

import codecs
import math
from typing import Any

from tasks.logprobs import TokenLogprob, token_text

UNLIKELY = -9999.0  # OpenAI's stand-in for a log probability of -inf


def _shown(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else UNLIKELY


def _alternative(raw: bytes, logprob: float) -> dict[str, Any]:
    return {"token": token_text(raw), "logprob": _shown(logprob), "bytes": list(raw)}


def content(entries: list[TokenLogprob]) -> list[dict[str, Any]]:
    """Chat's `logprobs.content` (and the Responses API's `logprobs`): one object per token."""
    return [
        {**_alternative(e.bytes, e.logprob or 0.0), "top_logprobs": [_alternative(b, lp) for b, lp in e.top]}
        for e in entries
    ]


def chat(entries: list[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's (or chunk's) `logprobs` object."""
    return {"content": content(entries), "refusal": None}


class Offsets:
    """Where each token begins in the text the tokens make, in characters, as the legacy `text_offset` counts: a
    token that holds only part of a character begins where that character does."""

    def __init__(self) -> None:
        self.chars = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def next(self, raw: bytes) -> int:
        at = self.chars
        self.chars += len(self._decoder.decode(raw))
        return at


def legacy(entries: list[TokenLogprob], offsets: Offsets, tops: bool) -> dict[str, Any]:
    """The legacy completions' `logprobs` object for these tokens, their offsets counted on from `offsets`; `tops`
    false (the request's `logprobs` is 0): `top_logprobs` is null. The prompt's first token (echo), which nothing
    predicts, has a null log probability and null alternatives."""
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [None if e.logprob is None else _shown(e.logprob) for e in entries],
        "top_logprobs": [_tops(e) for e in entries] if tops else None,
        "text_offset": [offsets.next(e.bytes) for e in entries],
    }


def _tops(entry: TokenLogprob) -> dict[str, float] | None:
    if entry.logprob is None:
        return None
    return {token_text(raw): _shown(logprob) for raw, logprob in entry.top}
