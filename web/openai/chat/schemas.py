"""The requests of /v1/chat/completions and /v1/completions: their messages and tools, and what each adds to the
sampling fields both share (web/openai/chat/sampling.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from tasks.errors import InvalidRequest
from tasks.job import NAME_PATTERN, TOP_LOGPROBS_MOST, JobSpec, Message
from tasks.settings import Settings
from tasks.structured import Constraint, Tool, ToolCall
from web.content import Content, read_content
from web.openai.chat.sampling import CHOICES_MOST, Sampling
from web.openai.schemas import STRICT, FunctionDefinition
from web.requests import structure


class ToolCallFunction(BaseModel):
    """The function a call sent back names, and its arguments (as JSON text)."""

    model_config = STRICT

    name: str
    arguments: str


class ChatToolCall(BaseModel):
    """A call an assistant's message made, sent back in the conversation."""

    model_config = STRICT

    id: str = Field(max_length=256)
    type: Literal["function"]
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content | None = None
    name: str | None = Field(
        None, pattern=NAME_PATTERN, description="the participant's name, shown to the model with the message"
    )
    tool_calls: list[ChatToolCall] | None = Field(None, description="an assistant's: the calls it made")
    tool_call_id: str | None = Field(None, max_length=256, description="a tool's: the call it answers")
    refusal: str | None = None  # an assistant's message sent back as it came

    def to_message(self) -> Message:
        content, images = read_content(self.content, self.role, "messages")
        calls = tuple(
            ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments) for c in self.tool_calls or ()
        )
        if self.role == "tool" and self.tool_call_id is None:
            raise InvalidRequest("a tool message needs the tool_call_id it answers", param="messages")
        return Message(
            role="system" if self.role == "developer" else self.role,
            content=content,
            tool_calls=calls,
            tool_call_id=self.tool_call_id,
            name=self.name,
            images=images,
        )


class ChatTool(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = STRICT

    name: str


class NamedToolChoice(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: NamedFunction


class ChatRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[ChatTool] | None = Field(None, max_length=128, description="functions the model may call")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="`auto` (default with tools): text or calls; `required`: calls; a function: that one"
    )
    parallel_tool_calls: bool | None = Field(None, description="several calls in one answer (default true)")
    logprobs: bool | None = Field(
        None, description="each answer token's log probability, in `choices[].logprobs.content` (streamed too)"
    )
    top_logprobs: int | None = Field(
        None,
        ge=0,
        le=TOP_LOGPROBS_MOST,
        description="... and the likeliest tokens' at each place, that many (needs `logprobs` true)",
    )

    def structure(self) -> tuple[Constraint | None, tuple[Tool, ...]]:
        choice = self.tool_choice.function.name if isinstance(self.tool_choice, NamedToolChoice) else self.tool_choice
        tools = [t.function.tool() for t in self.tools or []]
        return structure(tools, choice, self.parallel_tool_calls, self.response_format)

    def scoring(self) -> dict[str, Any]:
        if self.top_logprobs is not None and self.logprobs is not True:
            raise InvalidRequest("top_logprobs needs logprobs true", param="top_logprobs")
        return {"logprobs": bool(self.logprobs), "top_logprobs": self.top_logprobs or 0}

    def shows_logprobs(self) -> bool:
        return bool(self.logprobs)

    def admission(self, owner: str, settings: Settings, batch: bool = False) -> tuple[JobSpec, float]:
        """The job this request asks for (a batch's line: batch class, nobody watching), and its TTL."""
        self.check(batch)
        params = self.params(self.max_completion_tokens or self.max_tokens or settings.default_max_tokens)
        return self.job(owner, settings, params, None, tuple(m.to_message() for m in self.messages), batch)


class CompletionRequest(Sampling):
    prompt: str | list[str] = Field(
        json_schema_extra={
            "anyOf": [  # one prompt, as a string or a list of one
                {"type": "string", "minLength": 1},
                {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1},
            ]
        }
    )
    max_tokens: int | None = Field(None, ge=0, description="default 16; 0 only with `echo`: the prompt scored alone")
    logprobs: int | None = Field(
        None,
        ge=0,
        le=5,
        description="each token's log probability, and the likeliest tokens' at its place, that many (0: none)",
    )
    echo: bool = Field(False, description="the answer begins with the prompt (and its tokens, with `logprobs`)")
    best_of: int | None = Field(
        None,
        ge=1,
        le=CHOICES_MOST,
        description="generate this many answers (at least `n`) and return the `n` with the highest mean log "
        "probability per token, best first; `usage` counts them all; not streamed, nor in a batch's line",
    )

    def count(self) -> int:
        return self.best_of or self.n or 1

    def count_field(self) -> str:
        return "best_of" if self.best_of else "n"

    def scoring(self) -> dict[str, Any]:
        # best_of's candidates are ranked by their log probabilities, shown or not; echo scores the prompt (the job
        # says so: a batch's line is built from the job alone)
        return {
            "logprobs": self.logprobs is not None or self.count() > (self.n or 1),
            "top_logprobs": self.logprobs or 0,
            "prompt_logprobs": self.echo,
        }

    def shows_logprobs(self) -> bool:
        return self.logprobs is not None

    def check(self, batch: bool) -> None:
        if self.max_tokens == 0 and not self.echo:
            raise InvalidRequest(
                "max_tokens may be 0 only with echo (the prompt scored, nothing generated)", param="max_tokens"
            )
        if self.best_of is not None and self.best_of < (self.n or 1):
            raise InvalidRequest("best_of must be at least n", param="best_of")
        if (self.best_of or 1) > 1 and self.stream:
            raise InvalidRequest("best_of > 1 cannot be streamed: the best are known at the end", param="best_of")
        if (self.best_of or 1) > 1 and batch:
            raise InvalidRequest(
                "a batch's line asks for one answer: best_of > 1 is not supported there", param="best_of"
            )
        super().check(batch)

    def admission(self, owner: str, settings: Settings, batch: bool = False) -> tuple[JobSpec, float]:
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise InvalidRequest("onelane takes one prompt per request", param="prompt")
        prompt = self.prompt if isinstance(self.prompt, str) else self.prompt[0]
        self.check(batch)
        default = min(16, settings.max_tokens_limit)  # the legacy endpoint's default is 16 tokens
        params = self.params(default if self.max_tokens is None else self.max_tokens)
        return self.job(owner, settings, params, prompt, None, batch)
