"""A Messages API request, as Anthropic documents it, and the job it asks for.

A conversation's content blocks become the job's messages: `system` (a string or text blocks) its system message; a
user's `text` and `image` blocks a user message (its images in place); each `tool_result` block a tool message
answering its `tool_use_id` (before the user's words, as Anthropic puts them first); an assistant's `text` its
words and each `tool_use` block one of its calls; its `thinking` and `redacted_thinking` blocks (another model's, sent
back) are dropped, as Anthropic's models read no thinking of earlier turns. Every field the `anthropic` SDK's own
blocks carry is taken, so that an answer's blocks go back as `block.model_dump()` gives them. `tools` and `tool_choice` become the answer's grammar, as the
OpenAI endpoints' (web/openai/schemas.py `structure`): `auto` (words or calls), `any` (calls), `tool` (that one),
`none`. Any field onelane does not honor (`thinking` that must think, `mcp_servers`, `container` …) is a 400
naming it.

What coding agents send every turn is honored as a model that never thinks honors it (Claude Code's requests, read
from the wire): `thinking` `adaptive` (the model may choose not to think: it never does) or `disabled`;
`context_management` edits that clear thinking blocks (there are none); `output_config.effort` (a hint of how much to
think: these models do not reason at a chosen depth, so every effort is the same answer); a tool with
`defer_loading` is not told to the model (as Anthropic loads it only once a tool search finds it); a `system`
message among the turns is a system message there.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from tasks.errors import InvalidRequest
from tasks.images import assemble
from tasks.job import JobSpec, Message, SamplingParams
from tasks.settings import Settings
from tasks.structured import Tool, ToolCall, json_constraint
from web.openai.schemas import structure
from web.schemas import make_spec

STRICT = ConfigDict(extra="forbid", strict=True)
MARKED = ("ephemeral",)


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


class ToolParam(BaseModel):
    model_config = STRICT

    name: str = Field(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    defer_loading: bool | None = None  # not told to the model until a tool search finds it
    strict: bool | None = None  # (its input is always JSON of its schema)

    def tool(self) -> Tool:
        return Tool(name=self.name, description=self.description or "", parameters=self.input_schema)


class ToolChoice(BaseModel):
    model_config = STRICT

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Metadata(BaseModel):
    model_config = STRICT

    user_id: str | None = Field(None, max_length=256)


class OutputFormat(BaseModel):
    model_config = STRICT

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    """`format`: the answer is JSON of the schema, enforced as it is generated (Anthropic's structured outputs)."""

    model_config = STRICT

    format: OutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # (the same answer at every effort)


class Thinking(BaseModel):
    """`adaptive` (the model may think, or not: these never do) or `disabled`; `enabled` (it must think) is
    refused. `display` (how thinking would be shown, `updates` as Claude Code asks for streaming JSON) shows
    nothing: there is none."""

    model_config = STRICT

    type: Literal["adaptive", "disabled"]
    display: Literal["omitted", "summarized", "updates"] | None = None


class ContextEdit(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["clear_thinking_20251015"]  # (no thinking blocks are ever made: clearing them changes nothing)


class ContextManagement(BaseModel):
    model_config = STRICT

    edits: list[ContextEdit] = Field(default_factory=list)


class CountRequest(BaseModel):
    """POST /v1/messages/count_tokens: what a message request would send the model."""

    model_config = STRICT

    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolParam] | None = Field(None, max_length=128)
    tool_choice: ToolChoice | None = None
    cache_control: CacheControl | None = None  # the whole prompt marked for the cache
    output_config: OutputConfig | None = None
    thinking: Thinking | None = None
    context_management: ContextManagement | None = None

    @field_validator("thinking", mode="before")
    @classmethod
    def _no_thinking(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("type") == "enabled":
            raise ValueError("thinking of type 'enabled' is not supported by onelane: its models do not think")
        return value

    def conversation(self) -> tuple[Message, ...]:
        """The job's messages (see the module's docstring)."""
        turns: list[Message] = []
        if self.system:
            system = self.system if isinstance(self.system, str) else "".join(b.text for b in self.system)
            turns.append(Message(role="system", content=system))
        for i, m in enumerate(self.messages):
            turns += _turns(m, f"messages.{i}.content")
        return tuple(turns)

    def structure(self) -> tuple[Any, tuple[Tool, ...]]:
        tools = [t.tool() for t in self.tools or [] if not t.defer_loading]
        choice = self.tool_choice
        named = {"auto": "auto", "any": "required", "none": "none", "tool": choice.name if choice else None}
        if choice is not None and choice.type == "tool" and not choice.name:
            raise InvalidRequest("a tool_choice of type 'tool' names the tool", param="tool_choice.name")
        parallel = (
            None if choice is None or choice.disable_parallel_tool_use is None else not choice.disable_parallel_tool_use
        )
        form = self.output_config.format if self.output_config else None
        constraint, told = structure(tools, named[choice.type] if choice else None, parallel, None)
        if form is None:
            return constraint, told
        if constraint is not None:
            raise InvalidRequest(
                "onelane does not constrain an answer to both tools and a format", param="output_config"
            )
        return json_constraint(form.schema_, "output_config.format.schema"), told

    def admission(self, owner: str, settings: Settings) -> tuple[JobSpec, float]:
        """The count job this request asks for (its prompt rendered as a message request's), and its TTL."""
        constraint, tools = self.structure()
        return make_spec(
            owner,
            settings,
            SamplingParams(max_tokens=1),
            None,
            self.conversation(),
            model=self.model,
            watched=True,
            constraint=constraint,
            tools=tools,
            count=True,
        )

    def marks_cache(self) -> bool:
        """Whether a block asks its prefix to be cached (`cache_control`)."""
        blocks = [self, *(self.system if isinstance(self.system, list) else []), *(self.tools or [])]
        blocks += [b for m in self.messages for b in m.blocks()]
        return any(getattr(b, "cache_control", None) is not None for b in blocks)


class MessagesRequest(CountRequest):
    """POST /v1/messages."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = Field(None, max_length=8)
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=1, le=1_000_000)
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None

    def admission(self, owner: str, settings: Settings) -> tuple[JobSpec, float]:
        """The job this request asks for, watched by its connection, and its TTL."""
        if any(not s or len(s) > 256 for s in self.stop_sequences or []):
            raise InvalidRequest("each stop sequence has 1 to 256 characters", param="stop_sequences")
        temperature = 1.0 if self.temperature is None else float(self.temperature)  # (Anthropic's default)
        params = SamplingParams(
            max_tokens=self.max_tokens,
            temperature=temperature,
            top_p=self.top_p or 1.0,
            top_k=self.top_k or 0,
            stop=tuple(self.stop_sequences or ()),
        )
        constraint, tools = self.structure()
        return make_spec(
            owner,
            settings,
            params,
            None,
            self.conversation(),
            model=self.model,
            watched=True,
            stream=self.stream,
            constraint=constraint,
            tools=tools,
        )


def _turns(m: MessageParam, param: str) -> list[Message]:
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
