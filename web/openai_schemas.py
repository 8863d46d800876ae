"""The OpenAI requests onelane accepts: strict models of /v1/chat/completions and /v1/completions.

Unsupported fields get a 400 rather than being silently ignored; a few are let through with their neutral value.
"""

from __future__ import annotations

import re
import reprlib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

from tasks.batches import Endpoint
from tasks.errors import InvalidRequest
from tasks.job import (
    LOGIT_BIAS_MOST,
    TOP_LOGPROBS_MOST,
    Job,
    JobSpec,
    Message,
    Priority,
    ResponseFields,
    SamplingParams,
)
from tasks.settings import Settings
from tasks.structured import Constraint, Tool, ToolCall, call_id, json_constraint, read_calls, tools_constraint
from web.schemas import ResponseFormat, int_is_a_float, make_spec, parse, stops_schema

#: Fields onelane accepts only with their neutral value: anything else would change the answer's meaning. (`echo`
#: and `best_of` are the legacy completions'; chat lets their neutral values through, as it always did.)
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "echo": (False, None),
    "best_of": (1, None),
    "store": (False, None),
    "suffix": (None, ""),
}

CHOICES_MOST = 16  # answers one request may ask for (`n`, `best_of`): each is a job, and counts as one
TOKEN_ID = re.compile(r"0|[1-9][0-9]{0,9}")  # a token id as `logit_bias` names it: an integer, as a string
LOGIT_BIAS_SCHEMA = {
    "anyOf": [
        {
            "type": "object",
            "maxProperties": LOGIT_BIAS_MOST,
            "propertyNames": {"pattern": f"^({TOKEN_ID.pattern})$"},
            "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
        },
        {"type": "null"},
    ]
}


#: OpenAI's service tiers as onelane's priority classes; None: the caller's own default class.
TIERS: dict[str, Priority | None] = {"auto": None, "default": None, "flex": "batch", "priority": "interactive"}

STRICT = ConfigDict(extra="forbid", strict=True)  # as OpenAI: `true` is not 1, "0.5" is not 0.5


class TextPart(BaseModel):
    model_config = STRICT

    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = STRICT

    name: str
    arguments: str


class ChatToolCall(BaseModel):
    """A call an assistant's message made, sent back in the conversation."""

    model_config = STRICT

    id: str = Field(max_length=256)
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ChatToolCall] | None = Field(None, description="an assistant's: the calls it made")
    tool_call_id: str | None = Field(None, max_length=256, description="a tool's: the call it answers")
    refusal: str | None = None  # an assistant's message sent back as it came

    def to_message(self) -> Message:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
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
        )


class FunctionDefinition(BaseModel):
    model_config = STRICT

    name: str = Field(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def tool(self) -> Tool:
        if self.parameters is None:
            return Tool(name=self.name, description=self.description or "")
        return Tool(name=self.name, description=self.description or "", parameters=self.parameters)


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


def structure(
    tools: list[Tool],
    choice: str | None,
    parallel: bool | None,
    response_format: ResponseFormat | None,
) -> tuple[Constraint | None, tuple[Tool, ...]]:
    """What a request asks its answer to be (its grammar) and the tools its model is told of."""
    choice = choice or "auto"
    if tools and choice != "none":
        if response_format is not None and response_format.type != "text":
            raise InvalidRequest(
                "onelane does not constrain an answer to both tools and a response format", param="response_format"
            )
        return tools_constraint(tuple(tools), choice, parallel is not False), tuple(tools)
    if choice not in ("auto", "none"):
        raise InvalidRequest("tool_choice asks for a tool, but tools is empty", param="tool_choice")
    return (response_format.constraint() if response_format else None), ()


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False
    include_obfuscation: bool | None = None


class Sampling(BaseModel):
    """What both endpoints share. Defaults are OpenAI's (temperature 1)."""

    model_config = STRICT

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = Field(None, json_schema_extra=stops_schema(4))
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    service_tier: Literal["auto", "default", "flex", "priority"] | None = Field(
        None, description="`auto`/`default`: the key's class; `flex`: batch; `priority`: interactive"
    )
    ignore_eos: bool = Field(False, description="an extension, as in vLLM: generate to max_tokens past EOS")
    response_format: ResponseFormat | None = Field(
        None, description="`json_object` or `json_schema`: the answer follows it, token by token (on completions too)"
    )
    n: int | None = Field(
        None,
        ge=1,
        le=CHOICES_MOST,
        description="how many answers (`choices`, streamed interleaved with their `index`): a job each, each "
        "counted against quotas, the prompt read once for all; with a `seed`, choice 0 has it and each other one a "
        "seed derived from it (reproducible and distinct); not in a batch's line",
    )
    presence_penalty: float | None = Field(
        None, ge=-2.0, le=2.0, description="subtracted from the logit of every token the answer already holds"
    )
    frequency_penalty: float | None = Field(
        None, ge=-2.0, le=2.0, description="subtracted from a token's logit once for each time the answer holds it"
    )
    logit_bias: dict[str, float] | None = Field(
        None,
        json_schema_extra=LOGIT_BIAS_SCHEMA,
        description="token id (an integer, as a string) -> added to its logit: -100 bans it, 100 forces it; an id "
        "beyond the model's vocabulary is a 400",
    )

    _int_is_a_float = field_validator("temperature", "top_p", "presence_penalty", "frequency_penalty", mode="before")(
        int_is_a_float
    )

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _token_ids(cls, value: Any) -> Any:
        """Keys that are token ids, values -100 to 100 (either kind of JSON number), at most LOGIT_BIAS_MOST."""
        if not isinstance(value, dict):
            return value  # (the type's own error)
        if len(value) > LOGIT_BIAS_MOST:
            raise ValueError(f"logit_bias biases at most {LOGIT_BIAS_MOST} tokens")
        for key, bias in value.items():
            if not TOKEN_ID.fullmatch(key):
                raise ValueError(f"logit_bias's keys are token ids (integers, as strings), not {reprlib.repr(key)}")
            if type(bias) not in (int, float) or not -100 <= bias <= 100:
                raise ValueError(f"logit_bias's values are numbers from -100 to 100, not {reprlib.repr(bias)}")
        return {key: float(bias) for key, bias in value.items()}

    def count(self) -> int:
        """How many jobs the request is: one per answer generated."""
        return self.n or 1

    def scoring(self) -> dict[str, Any]:
        """The log probabilities its jobs record (SamplingParams' `logprobs`, `top_logprobs`, `prompt_logprobs`)."""
        return {}

    def shows_logprobs(self) -> bool:
        """Its answers show their log probabilities."""
        return False

    def check(self, batch: bool) -> None:
        """What the fields allow together; a batch's line is one job (its runner reads one answer per line)."""
        if batch and self.count() > 1:
            raise InvalidRequest("a batch's line asks for one answer: send n lines rather than n > 1", param="n")

    def structure(self) -> tuple[Constraint | None, tuple[Tool, ...]]:
        return structure([], None, None, self.response_format)

    def params(self, max_tokens: int) -> SamplingParams:
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if len(stops) > 4 or any(not s for s in stops):
            raise InvalidRequest("stop takes up to 4 non-empty strings", param="stop")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=self.seed,
            stop=tuple(stops),
            ignore_eos=self.ignore_eos,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            logit_bias={int(token): bias for token, bias in (self.logit_bias or {}).items()},
            **self.scoring(),
        )

    def priority(self) -> Priority | None:
        """The priority class the service tier asks for (None: the caller's default)."""
        return TIERS[self.service_tier] if self.service_tier else None

    def job(
        self,
        owner: str,
        settings: Settings,
        params: SamplingParams,
        prompt: str | None,
        messages: tuple[Message, ...] | None,
        batch: bool,
    ) -> tuple[JobSpec, float]:
        """The job and its TTL: watched by the request, or a batch's line (batch class, nobody watching). A request
        of several answers is that job several times over (web/choices.py)."""
        priority = "batch" if batch else self.priority()
        constraint, tools = self.structure()
        return make_spec(
            owner,
            settings,
            params,
            prompt,
            messages,
            model=self.model,
            priority=priority,
            watched=not batch,
            constraint=constraint,
            tools=tools,
        )


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


def parse_openai(model: type[BaseModel], body: dict[str, Any], neutral: dict[str, tuple[Any, ...]] = NEUTRAL) -> Any:
    """Validate, refusing unsupported fields by name; the neutral value of a known field is let through."""
    for field in list(body):
        if field in neutral and field not in model.model_fields:
            if not _neutral(body[field], neutral[field]):
                shown = reprlib.repr(body[field])  # a bounded excerpt of what was sent
                raise InvalidRequest(f"'{field}' = {shown} is not supported by onelane", param=field)
            del body[field]
        elif field not in model.model_fields:
            raise InvalidRequest(f"'{field}' is not supported by onelane", param=field)
    return parse(model, body)


def _neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    """`value` is one of the neutral values, of the same JSON type (`true` is not 1, nor 1.0 an integer 1)."""
    return any(value == v and type(value) is type(v) for v in neutral)


def bounded_metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's bounds on `metadata`: 16 pairs, keys up to 64 and values up to 512 characters."""
    if value is not None and (len(value) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in value.items())):
        raise ValueError("metadata takes up to 16 pairs, keys up to 64 and values up to 512 characters")
    return value


# --- the Responses API (/v1/responses) ------------------------------------------------------------------------


class InputText(BaseModel):
    model_config = STRICT

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # an earlier answer's output_text, sent back as it came
    logprobs: list[Any] | None = None


class InputMessage(BaseModel):
    """One message of a response's `input` (an "easy input message", or an item of type `message`)."""

    model_config = STRICT

    type: Literal["message"] | None = None
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[InputText]
    id: str | None = None  # an earlier output item's, sent back as it came
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def to_message(self) -> Message:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return Message(role="system" if self.role == "developer" else self.role, content=content)


class FunctionCallInput(BaseModel):
    """A call an earlier answer made (an output item of type `function_call`), sent back in `input`."""

    model_config = STRICT

    type: Literal["function_call"]
    call_id: str = Field(max_length=256)
    name: str
    arguments: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def call(self) -> ToolCall:
        return ToolCall(id=self.call_id, name=self.name, arguments=self.arguments)


class FunctionCallOutput(BaseModel):
    """What the caller's function returned for the call `call_id`: the model reads it as the tool's answer."""

    model_config = STRICT

    type: Literal["function_call_output"]
    call_id: str = Field(max_length=256)
    output: str | list[InputText]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def to_message(self) -> Message:
        content = self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)
        return Message(role="tool", content=content, tool_call_id=self.call_id)


def _item_type(value: Any) -> str:
    """An input item's type; an "easy input message" has none."""
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) else "message"


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[FunctionCallInput, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")],
    Discriminator(_item_type),
]


def turns_of(items: list[InputItem]) -> list[Message]:
    """Input items as the conversation's messages: calls in a row are one assistant message's tool_calls."""
    turns: list[Message] = []
    for item in items:
        if not isinstance(item, FunctionCallInput):
            turns.append(item.to_message())
        elif turns and turns[-1].role == "assistant":
            turns[-1] = turns[-1].model_copy(update={"tool_calls": (*turns[-1].tool_calls, item.call())})
        else:
            turns.append(Message(role="assistant", content="", tool_calls=(item.call(),)))
    return turns


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


OUTPUT_LOGPROBS = "message.output_text.logprobs"  # the one `include` onelane knows


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
        description=f"`{OUTPUT_LOGPROBS}`: each output_text part's `logprobs` (and each text delta's); no other "
        "value is supported",
        json_schema_extra={"anyOf": [{"type": "array", "items": {"enum": [OUTPUT_LOGPROBS]}}, {"type": "null"}]},
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
        unknown = [v for v in value if v != OUTPUT_LOGPROBS] if isinstance(value, list) else []
        if unknown:
            raise ValueError(f"onelane does not support include {reprlib.repr(unknown[0])} (only {OUTPUT_LOGPROBS})")
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
            response=extra,
            constraint=constraint,
            tools=tools,
        )


#: What a response echoes of its request when the request left it out (OpenAI's defaults).
RESPONSE_ECHO: dict[str, Any] = {
    "text": {"format": {"type": "text"}},
    "tools": [],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
}


def input_of(job: Job) -> tuple[Message, ...]:
    """A response's input, as the conversation it answers: its messages without its instructions (the system
    message they became; OpenAI keeps them apart, and carries them no further)."""
    messages = job.spec.messages or ()
    if job.spec.response is not None and job.spec.response.instructions:
        return messages[1:]
    return messages


def answer_of(job: Job) -> Message:
    """A response's answer as the assistant's message: its words, and the calls it made (under `tools`)."""
    words, calls = read_calls(job.output, job.spec.constraint)
    made = tuple(ToolCall(id=call_id(job.id, i), name=name, arguments=args) for i, (name, args) in enumerate(calls))
    return Message(role="assistant", content=words, tool_calls=made)


def conversation_of(job: Job) -> tuple[Message, ...]:
    """What a response that continues `job`'s begins with: its input, then its answer."""
    return (*input_of(job), answer_of(job))


#: Responses fields onelane takes only with their neutral value (anything else: 400 naming the field).
RESPONSE_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "reasoning": (None,),
    "conversation": (None,),
    "prompt": (None,),
    "max_tool_calls": (None,),
    "stream_options": (None,),
}


# --- the Batch API (/v1/batches) ------------------------------------------------------------------------------


class ExpiresAfter(BaseModel):
    """How long a batch's output and error files are kept: `seconds` after each is written (its `created_at`)."""

    model_config = STRICT

    anchor: Literal["created_at"] = Field(description="the file's creation, as OpenAI's (not the batch's)")
    seconds: int = Field(ge=3600, le=2_592_000, description="1 hour to 30 days")


class BatchRequest(BaseModel):
    """POST /v1/batches: run every request of an uploaded JSONL file (purpose `batch`) against one endpoint."""

    model_config = STRICT

    input_file_id: str = Field(max_length=256)
    endpoint: Endpoint
    completion_window: Literal["24h"] = Field(description="the only window: ONELANE_BATCH_WINDOW seconds (24 h)")
    metadata: dict[str, str] | None = Field(
        None, description="up to 16 pairs, echoed back", json_schema_extra={"maxProperties": 16}
    )
    output_expires_after: ExpiresAfter | None = Field(
        None, description="how long the output and error files are kept (default: ONELANE_FILE_RETENTION)"
    )

    _bounded_metadata = field_validator("metadata")(bounded_metadata)
