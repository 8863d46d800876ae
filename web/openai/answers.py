"""What several OpenAI endpoints answer alike, as pydantic models (/openapi.json documents them): a token's log
probability and the likeliest tokens at its place (chat completions, the Responses API)."""

from __future__ import annotations

from pydantic import Field

from web.responses import Answer


class TopLogprob(Answer):
    """One of the likeliest tokens at a place."""

    token: str = Field(description="its text; `bytes:\\xe2\\x80` for bytes that are only part of a character")
    logprob: float = Field(
        description="its log probability under the sampler's distribution (after biases, penalties and a grammar's "
        "mask; before temperature and top_p); -9999.0 for a token ruled out"
    )
    bytes: list[int] = Field(description="its UTF-8 bytes")


class TokenLogprob(TopLogprob):
    """A token of the answer, and the likeliest tokens at its place."""

    top_logprobs: list[TopLogprob] = Field(description="likeliest first, as many as `top_logprobs` asked")
