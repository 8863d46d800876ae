"""POST /v1/responses: the request of OpenAI's Responses API, its text formats and function tools."""

from __future__ import annotations

import reprlib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tasks.errors import InvalidRequest
from tasks.job import TOP_LOGPROBS_MOST, JobSpec, Message, Priority, ResponseFields, SamplingParams
from tasks.settings import Settings
from tasks.structured import Constraint, Tool, json_constraint
from web.openai.responses.input import InputItem, turns_of
from web.openai.schemas import STRICT, TIERS, FunctionDefinition, bounded_metadata
from web.requests import structure
from web.schemas import int_is_a_float, make_spec


class PlainText(BaseModel):
    model_config = STRICT

    type: Literal["text"]

    def constraint(self) -> Constraint | None:
        return None


class JsonObjectFormat(BaseModel):
    """Any JSON object, as chat completions' `json_object`."""

    model_config = STRICT

    type: Literal["json_object"]

    def constraint(self) -> Constraint | None:
        return json_constraint(None, "text.format")


class JsonSchemaFormat(BaseModel):
    """JSON of `schema` (the Responses API's flat `json_schema` format): enforced, `strict` or not."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    type: Literal["json_schema"]
    name: str = Field(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None

    def constraint(self) -> Constraint | None:
        return json_constraint(self.schema_, "text.format.schema")


TextFormat = Annotated[PlainText | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class TextOptions(BaseModel):
    model_config = STRICT

    format: TextFormat | None = Field(
        None, description="`json_object` or `json_schema`: the answer follows it, token by token"
    )
    verbosity: Literal["medium"] | None = None

    @field_validator("format", mode="before")
    @classmethod
    def _named_schema(cls, value: Any) -> Any:
        missing = [k for k in ("name", "schema") if isinstance(value, dict) and k not in value]
        if isinstance(value, dict) and value.get("type") == "json_schema" and missing:
            raise ValueError(f"a json_schema format needs its {' and '.join(missing)}")
        return value


class FunctionTool(FunctionDefinition):
    """A function the model may call (the Responses API's flat shape of chat completions' tool)."""

    type: Literal["function"]


class FunctionChoice(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    name: str


OUTPUT_LOGPROBS = "message.output_text.logprobs"  # the `include` onelane fills
# what a model that does not reason has none of: included, it adds nothing (Codex CLI asks for it every turn)
REASONING_CONTENT = "reasoning.encrypted_content"
INCLUDES = (OUTPUT_LOGPROBS, REASONING_CONTENT)


class Reasoning(BaseModel):
    """How much a reasoning model should think, and what summary of it to give. onelane's models do not reason: any
    effort gives the same answer, and no reasoning item (nor its summary) is made; accepted, as coding agents send it
    every turn."""

    model_config = STRICT

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponseRequest(BaseModel):
    """POST /v1/responses: a job in the same queue. Fields of the API that would change the answer's meaning
    (reasoning, built-in tools, conversations) are refused by name."""

    model_config = STRICT

    model: str
    input: str | list[InputItem] = Field(
        description="the user's text, or the conversation's items: messages, function calls and their outputs"
    )
    instructions: str | None = Field(None, description="the system message, put before `input`")
    previous_response_id: str | None = Field(
        None,
        description="continue that response's conversation: its input (not its instructions) and its answer (its "
        "words or its calls) come before `input`; it must have ended completed or incomplete, and is kept "
        "ONELANE_RESULT_TTL after its end",
    )
    background: bool = Field(False, description="answer at once with the queued response; poll or stream it later")
    stream: bool = False
    store: bool = Field(True, description="always stored, as a job: `false` is refused with `background`")
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    service_tier: Literal["auto", "default", "flex", "priority"] | None = Field(
        None, description="`auto`/`default`: the key's class; `flex`: batch; `priority`: interactive"
    )
    metadata: dict[str, str] | None = Field(
        None, description="up to 16 pairs, echoed back", json_schema_extra={"maxProperties": 16}
    )
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = Field(None, description="accepted; onelane's prefix cache needs no key")
    reasoning: Reasoning | None = Field(None, description="accepted; the models do not reason (no reasoning items)")
    client_metadata: dict[str, str] | None = Field(
        None,
        description="a client's own notes (Codex CLI's): accepted, not echoed",
        json_schema_extra={"maxProperties": 32},
    )
    text: TextOptions | None = None
    tools: list[FunctionTool] | None = Field(
        None, max_length=128, description="functions the model may call (no built-in tools: they are refused)"
    )
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = Field(
        None, description="`auto` (default with tools): words or calls; `required`: calls; a function: that one"
    )
    parallel_tool_calls: bool | None = Field(None, description="several calls in one answer (default true)")
    truncation: Literal["disabled"] | None = None
    ignore_eos: bool = Field(False, description="an extension, as on the chat endpoint: generate to the limit")
    include: list[str] | None = Field(
        None,
        description=f"`{OUTPUT_LOGPROBS}`: each output_text part's `logprobs` (and each text delta's); "
        f"`{REASONING_CONTENT}`: nothing (no reasoning is made); no other value is supported",
        json_schema_extra={"anyOf": [{"type": "array", "items": {"enum": list(INCLUDES)}}, {"type": "null"}]},
    )
    top_logprobs: int | None = Field(
        None,
        ge=0,
        le=TOP_LOGPROBS_MOST,
        description=f"the likeliest tokens' log probabilities at each place, that many (more than 0: with "
        f"`include` {OUTPUT_LOGPROBS})",
    )

    _int_is_a_float = field_validator("temperature", "top_p", mode="before")(int_is_a_float)

    @field_validator("include", mode="before")
    @classmethod
    def _known(cls, value: Any) -> Any:
        unknown = [v for v in value if v not in INCLUDES] if isinstance(value, list) else []
        if unknown:
            known = " or ".join(INCLUDES)
            raise ValueError(f"onelane does not support include {reprlib.repr(unknown[0])} (only {known})")
        return value

    @field_validator("client_metadata")
    @classmethod
    def _bounded_notes(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and (len(value) > 32 or any(len(k) > 64 or len(v) > 4096 for k, v in value.items())):
            raise ValueError("client_metadata takes up to 32 pairs, keys up to 64 and values up to 4096 characters")
        return value

    @field_validator("input")
    @classmethod
    def _some_input(cls, value: str | list[InputItem]) -> str | list[InputItem]:
        if not value:
            raise ValueError("input is empty")
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _functions_only(cls, value: Any) -> Any:
        if isinstance(value, list):
            kinds = sorted({str(t.get("type")) for t in value if isinstance(t, dict) and t.get("type") != "function"})
            if kinds:
                raise ValueError(f"onelane's models call functions only; not supported: {', '.join(kinds)}")
        return value

    _bounded_metadata = field_validator("metadata")(bounded_metadata)

    def messages(self, before: tuple[Message, ...] = ()) -> tuple[Message, ...]:
        """The conversation the model answers: `instructions` as the system message, then what came `before` (the
        conversation the previous response ended), then `input`."""
        if isinstance(self.input, str):
            turns = [*before, Message(role="user", content=self.input)]
        else:
            turns = [*before, *turns_of(self.input)]
        if self.instructions:
            turns.insert(0, Message(role="system", content=self.instructions))
        return tuple(turns)

    def params(self, default_max_tokens: int) -> SamplingParams:
        logprobs = OUTPUT_LOGPROBS in (self.include or [])
        if self.top_logprobs and not logprobs:
            raise InvalidRequest(f"top_logprobs needs include {OUTPUT_LOGPROBS}", param="top_logprobs")
        return SamplingParams(
            max_tokens=self.max_output_tokens or default_max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            top_logprobs=self.top_logprobs or 0,
        )

    def priority(self) -> Priority | None:
        return TIERS[self.service_tier] if self.service_tier else None

    def structure(self) -> tuple[Constraint | None, tuple[Tool, ...]]:
        """The answer's grammar and the tools its model is told of, by chat's rules; `text.format` as chat's
        `response_format` (refused beside tools the model may call)."""
        choice = self.tool_choice.name if isinstance(self.tool_choice, FunctionChoice) else self.tool_choice
        tools = [t.tool() for t in self.tools or []]
        constraint, told = structure(tools, choice, self.parallel_tool_calls, None)
        form = self.text.format if self.text is not None else None
        if form is None or form.type == "text":
            return constraint, told
        if told:
            raise InvalidRequest(
                "onelane does not constrain an answer to both tools and a text format", param="text.format"
            )
        return form.constraint(), told

    def echo(self) -> dict[str, Any]:
        """What the response echoes of the request beyond the job: the fields it gave of RESPONSE_ECHO."""
        echo: dict[str, Any] = {}
        if self.text is not None and self.text.format is not None:
            echo["text"] = {"format": self.text.format.model_dump(by_alias=True, exclude_none=True)}
        if self.tools is not None:
            echo["tools"] = [{"type": "function", **t.model_dump(exclude={"type"})} for t in self.tools]
        if self.tool_choice is not None:
            choice = self.tool_choice
            echo["tool_choice"] = choice.model_dump() if isinstance(choice, FunctionChoice) else choice
        if self.parallel_tool_calls is not None:
            echo["parallel_tool_calls"] = self.parallel_tool_calls
        return echo

    def admission(
        self, owner: str, settings: Settings, batch: bool = False, before: tuple[Message, ...] = ()
    ) -> tuple[JobSpec, float]:
        """A foreground response is watched by its request; a background one (or a batch's line) by nobody.
        `before`: the conversation `previous_response_id` names (`conversation_of` that response)."""
        if self.background and not self.store:
            raise InvalidRequest("background responses are stored: `store` must not be false", param="store")
        if batch and self.previous_response_id is not None:
            raise InvalidRequest("a batch's responses cannot continue another response", param="previous_response_id")
        params = self.params(settings.default_max_tokens)
        if params.max_tokens > settings.max_tokens_limit:
            raise InvalidRequest(
                f"max_output_tokens may be at most {settings.max_tokens_limit}", param="max_output_tokens"
            )
        constraint, tools = self.structure()
        extra = ResponseFields(
            background=self.background and not batch,
            instructions=self.instructions,
            metadata=self.metadata or {},
            service_tier=self.service_tier or "default",
            previous_response_id=self.previous_response_id,
            echo=self.echo(),
        )
        return make_spec(
            owner,
            settings,
            params,
            None,
            self.messages(before),
            model=self.model,
            priority="batch" if batch else self.priority(),
            watched=not (self.background or batch),
            stream=bool(self.stream) and not batch,
            line=batch,
            response=extra,
            constraint=constraint,
            tools=tools,
            field="input",
        )


#: What a response echoes of its request when the request left it out (OpenAI's defaults).
RESPONSE_ECHO: dict[str, Any] = {
    "text": {"format": {"type": "text"}},
    "tools": [],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
}
#: Responses fields onelane takes only with their neutral value (anything else: 400 naming the field).
RESPONSE_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "conversation": (None,),
    "prompt": (None,),
    "max_tool_calls": (None,),
    "stream_options": (None,),
}
