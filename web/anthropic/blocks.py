"""A Messages API conversation's content blocks, and the job's messages they become.

`system` (a string or text blocks) is the system message; a user's `text` and `image` blocks a user message (its
images in place); each `tool_result` block a tool message answering its `tool_use_id` (before the user's words, as
Anthropic puts them first); an assistant's `text` its words and each `tool_use` block one of its calls; its
`thinking` and `redacted_thinking` blocks (another model's, sent back) are dropped, as Anthropic's models read no
thinking of earlier turns. Every field the `anthropic` SDK's own blocks carry is taken, so that an answer's blocks go
back as `block.model_dump()` gives them; what onelane does not run (a server tool's call, a toolset) is a 400.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from tasks.errors import InvalidRequest
from tasks.images import assemble
from tasks.job import Message
from tasks.structured import ToolCall

STRICT = ConfigDict(extra="forbid", strict=True)


def _no_toolset(value: str | None) -> None:
    if value is not None:
        raise ValueError("onelane serves no toolsets: a block's toolset_name is null")


#: a block's toolset (a family of server-defined tools, as Anthropic's browser tools): null, as the SDK dumps it
NoToolset = Annotated[str | None, AfterValidator(_no_toolset)]


class CacheControl(BaseModel):
    model_config = STRICT

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(BaseModel):
    model_config = STRICT

    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[Any] | None = None  # (an earlier answer's, sent back as it came: none are made here)


class Base64Source(BaseModel):
    model_config = STRICT

    type: Literal["base64"]
    media_type: Literal["image/png", "image/jpeg", "image/webp", "image/gif"]
    data: str


class URLSource(BaseModel):
    model_config = STRICT

    type: Literal["url"]
    url: str


class ImageBlock(BaseModel):
    """An image in a user's turn, for a model that reads images (tasks/images.py bounds it)."""

    model_config = STRICT

    type: Literal["image"]
    source: Base64Source | URLSource
    cache_control: CacheControl | None = None

    def url(self) -> str:
        s = self.source
        return f"data:{s.media_type};base64,{s.data}" if isinstance(s, Base64Source) else s.url


class Caller(BaseModel):
    """Who made a call: the model itself (`direct`); a call a server tool made on its behalf is never onelane's."""

    model_config = STRICT

    type: str
    tool_id: str | None = None

    @field_validator("type")
    @classmethod
    def _direct(cls, value: str) -> str:
        if value != "direct":
            raise ValueError(f"a call made by a server tool ({value!r}) is not onelane's: it runs no server tools")
        return value


class ToolUseBlock(BaseModel):
    """A call an earlier answer made, sent back in the conversation, with every field the SDK's own block carries
    (`block.model_dump()`): `caller` and `toolset_name` are told to no model (onelane serves no toolsets)."""

    model_config = STRICT

    type: Literal["tool_use"]
    id: str = Field(max_length=256)
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    caller: Caller | None = None
    toolset_name: NoToolset = None


class ThinkingBlock(BaseModel):
    """An earlier answer's thinking (another model's: these never think), sent back as it came. Anthropic's models
    read no thinking of earlier turns, and neither do onelane's: it is dropped."""

    model_config = STRICT

    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingBlock(BaseModel):
    """An earlier answer's redacted thinking, sent back as it came: dropped as thinking is."""

    model_config = STRICT

    type: Literal["redacted_thinking"]
    data: str


class ToolResultBlock(BaseModel):
    """What the caller's tool returned for the call `tool_use_id`: the model reads it as the tool's answer."""

    model_config = STRICT

    type: Literal["tool_result"]
    tool_use_id: str = Field(max_length=256)
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None
    toolset_name: NoToolset = None

    def text(self) -> str:
        words = self.content if isinstance(self.content, str) else "".join(b.text for b in self.content or [])
        return f"Error: {words}" if self.is_error else words


Block = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ImageBlock, Tag("image")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[RedactedThinkingBlock, Tag("redacted_thinking")],
    Discriminator(lambda v: v.get("type") if isinstance(v, dict) else getattr(v, "type", None)),
]


class MessageParam(BaseModel):
    model_config = STRICT

    role: Literal["user", "assistant", "system"]
    content: str | list[Block]

    def blocks(self) -> list[Any]:
        return [TextBlock(type="text", text=self.content)] if isinstance(self.content, str) else list(self.content)


def turns(m: MessageParam, param: str) -> list[Message]:
    """A message's blocks as the job's messages."""
    blocks = m.blocks()
    if m.role == "system":
        if any(not isinstance(b, TextBlock) for b in blocks):
            raise InvalidRequest("a system turn holds text blocks only", param=param)
        return [Message(role="system", content="".join(b.text for b in blocks))]
    if m.role == "assistant":
        if any(isinstance(b, ImageBlock | ToolResultBlock) for b in blocks):
            raise InvalidRequest("an assistant's turn holds text, thinking and tool_use blocks only", param=param)
        words = "".join(b.text for b in blocks if isinstance(b, TextBlock))
        calls = tuple(
            ToolCall(id=b.id, name=b.name, arguments=json.dumps(b.input)) for b in blocks if isinstance(b, ToolUseBlock)
        )
        return [Message(role="assistant", content=words, tool_calls=calls)]
    if any(isinstance(b, ToolUseBlock | ThinkingBlock | RedactedThinkingBlock) for b in blocks):
        raise InvalidRequest("a user's turn holds text, image and tool_result blocks only", param=param)
    turns = [
        Message(role="tool", content=b.text(), tool_call_id=b.tool_use_id)
        for b in blocks
        if isinstance(b, ToolResultBlock)
    ]
    parts = [
        ("image", b.url()) if isinstance(b, ImageBlock) else ("text", b.text)
        for b in blocks
        if isinstance(b, TextBlock | ImageBlock)
    ]
    if parts or not turns:
        text, images = assemble(parts, param)
        turns.append(Message(role="user", content=text, images=images))
    return turns
