"""A Messages API request, as Anthropic documents it, and the job it asks for.

A conversation's content blocks become the job's messages (web/anthropic/blocks.py). `tools` and `tool_choice`
become the answer's grammar, as the OpenAI endpoints' (web/requests.py `structure`): `auto` (words or calls),
`any` (calls), `tool` (that one), `none`. Any field onelane does not honor (`thinking` that must think,
`mcp_servers`, `container` …) is a 400 naming it.

What coding agents send every turn is honored as a model that never thinks honors it (Claude Code's requests, read
from the wire): `thinking` `adaptive` (the model may choose not to think: it never does) or `disabled`;
`context_management` edits that clear thinking blocks (there are none); `output_config.effort` (a hint of how much to
think: these models do not reason at a chosen depth, so every effort is the same answer); a tool with
`defer_loading` is not told to the model (as Anthropic loads it only once a tool search finds it); a `system`
message among the turns is a system message there.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tasks.errors import InvalidRequest
from tasks.job import JobSpec, Message, SamplingParams
from tasks.settings import Settings
from tasks.structured import Tool, json_constraint
from web.anthropic.blocks import STRICT, CacheControl, MessageParam, TextBlock, turns
from web.requests import structure
from web.schemas import make_spec


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
        """The job's messages (web/anthropic/blocks.py)."""
        said: list[Message] = []
        if self.system:
            system = self.system if isinstance(self.system, str) else "".join(b.text for b in self.system)
            said.append(Message(role="system", content=system))
        for i, m in enumerate(self.messages):
            said += turns(m, f"messages.{i}.content")
        return tuple(said)

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
            clip=True,  # (Claude Code asks for 32,000 tokens by default, whatever the model)
        )
