"""The Messages API's answers as /openapi.json describes them (web/anthropic/body.py writes them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from web.responses import Answer


class MessageUsage(Answer):
    input_tokens: int = Field(description="the prompt's tokens neither read from nor written to the prefix cache")
    cache_creation_input_tokens: int = Field(
        description="a request marking `cache_control`: the prompt's tokens the worker read and kept in its cache"
    )
    cache_read_input_tokens: int = Field(description="the prompt's tokens read from the worker's prefix cache")
    output_tokens: int
    service_tier: Literal["standard"]


class TextContent(Answer):
    type: Literal["text"]
    text: str


class ToolUseContent(Answer):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] = Field(description="the call's input, JSON of the tool's input_schema")


class Message(Answer):
    """The answer: words (one text block) or calls (one tool_use block each); a call cut short by `max_tokens` is
    left out, not handed back with an unfinished input (`stop_reason` says why it ended)."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[TextContent | ToolUseContent]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None = Field(description="the stop sequence it ended at, if it did")
    usage: MessageUsage


class TokenCount(Answer):
    """The request's prompt in tokens, as the model reads it (its chat template, tools and all)."""

    input_tokens: int


class StreamEvent(Answer):
    """One event's data in a streamed answer (its `event:` line names the same type): message_start,
    content_block_start, content_block_delta, content_block_stop, message_delta, message_stop, ping, or error; each
    with Anthropic's fields for it."""

    model_config = ConfigDict(extra="allow")

    type: str
