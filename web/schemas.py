"""Request bodies, validated with pydantic; unknown fields are refused, not ignored."""

from __future__ import annotations

import json
from typing import Any, Literal

from flask import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasks.errors import Forbidden, InvalidJSON, InvalidRequest, ModelNotFound, PromptTooLarge
from tasks.job import JobSpec, Message, Priority, ResponseFields, SamplingParams
from tasks.settings import Settings
from tasks.structured import Constraint, Tool, json_constraint
from tasks.users import User
from web.body import raw as body_bytes


def int_is_a_float(value: Any) -> Any:
    """A JSON integer where a number is expected, as a float (strict models take no int for a float)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return value
    try:
        return float(value)
    except OverflowError:  # beyond any float: left as it is, for validation to refuse
        return value


def stops_schema(most: int, longest: int | None = None) -> dict[str, Any]:
    """The JSON schema of `stop` (a string or a list of them, none empty), for the rule its validator applies."""
    one: dict[str, Any] = {"type": "string", "minLength": 1, **({"maxLength": longest} if longest else {})}
    return {"anyOf": [one, {"type": "array", "items": one, "maxItems": most}, {"type": "null"}]}


class JsonSchema(BaseModel):
    """`response_format.json_schema`: the schema the answer follows (enforced, `strict` or not)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    name: str = Field(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """`text` (free), `json_object` (any JSON object) or `json_schema`: enforced while the answer is generated."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None

    def constraint(self) -> Constraint | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return json_constraint(None, "response_format")
        if self.json_schema is None:
            raise InvalidRequest("a json_schema response_format needs its json_schema", param="response_format")
        return json_constraint(self.json_schema.schema_, "response_format.json_schema.schema")


class SubmitJob(BaseModel):
    """POST /v1/jobs: exactly one of prompt or messages, plus sampling options; the model and the priority class
    default to the server's default model and the caller's own class."""

    # the schema also says what _one_input checks, so that /openapi.json tells it
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "oneOf": [
                {"required": ["prompt"], "properties": {"prompt": {"type": "string", "minLength": 1}}},
                {"required": ["messages"], "properties": {"messages": {"type": "array"}}},
            ]
        },
    )

    model: str | None = Field(None, description="one of /v1/models; default: the server's default model")
    priority: Priority | None = Field(
        None,
        description="`batch` runs when no interactive job waits, or at a "
        "guaranteed share; default: the caller's own class",
    )
    prompt: str | None = None
    messages: list[Message] | None = Field(None, min_length=1)
    max_tokens: int | None = Field(None, ge=1, description="default: the server's ONELANE_DEFAULT_MAX_TOKENS")
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = Field(None, json_schema_extra=stops_schema(8, 256))
    ignore_eos: bool = Field(False, description="generate to max_tokens past EOS (as vLLM)")
    ttl_s: float | None = Field(None, gt=0, description="how long it may wait; default and most: ONELANE_JOB_TTL")
    abandon_on_disconnect: bool = Field(
        False, description="skip it once its client stops watching (polling or following its events)"
    )
    response_format: ResponseFormat | None = Field(
        None,
        description="as chat completions': `json_object` or `json_schema`, enforced token by token; the output "
        "is the JSON, as text",
    )

    _int_is_a_float = field_validator("temperature", "top_p", "ttl_s", mode="before")(int_is_a_float)

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> list[str] | None:
        stops = [value] if isinstance(value, str) else value
        if stops is not None and (len(stops) > 8 or any(not s or len(s) > 256 for s in stops)):
            raise ValueError("at most 8 stop strings, each 1 to 256 characters")
        return stops

    @model_validator(mode="after")
    def _one_input(self) -> SubmitJob:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send exactly one of 'prompt' or 'messages'")
        return self


MAX_DEPTH = 32  # deeper than any request needs, and far from the recursion limit of what reads it next


def json_body(request: Request) -> dict[str, Any]:
    """The body as a JSON object of valid text, or InvalidJSON."""
    if not request.is_json:
        raise InvalidJSON("send a JSON object with 'Content-Type: application/json'")
    try:
        body = json.loads(body_bytes(request), parse_constant=_not_json)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        raise InvalidJSON("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidJSON("the body must be a JSON object")
    _check_text(body)
    return body


def _not_json(constant: str) -> None:
    """NaN and Infinity: Python's json reads them, but they are not JSON."""
    raise ValueError(f"{constant} is not JSON")


def _check_text(body: dict[str, Any]) -> None:
    """Refuse nesting deeper than MAX_DEPTH, and any string, key or value, that is not valid Unicode text."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            try:
                value.encode()
            except UnicodeEncodeError:  # a lone surrogate ("\ud800") parses, but Redis and the model cannot take it
                raise InvalidJSON("a string holds a lone UTF-16 surrogate; send valid Unicode text") from None
        elif isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                raise InvalidJSON(f"the body is nested more than {MAX_DEPTH} levels deep")
            items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items)


def parse(model: type[BaseModel], body: dict[str, Any]) -> Any:
    """Validate `body` as `model`, or InvalidRequest naming the first field at fault."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors()
        where = _field_path(errors[0]["loc"], body)
        message = "; ".join(f"{_field_path(e['loc'], body) or 'body'}: {e['msg']}" for e in errors[:5])
        raise InvalidRequest(message, param=where or None) from None


def _field_path(loc: tuple[int | str, ...], body: Any) -> str:
    """The field a validation error is about ("messages.0.content"), less the union member it was tried as."""
    path = []
    for part in loc:  # a union member's name ("stop.str") comes where the value holds nothing to name
        if not isinstance(body, dict | list) or isinstance(body, list) is not isinstance(part, int):
            break
        path.append(str(part))
        body = body.get(part) if isinstance(body, dict) else body[part] if part < len(body) else None
    return ".".join(path)


def to_spec(req: SubmitJob, owner: str, settings: Settings, watched: bool = False) -> tuple[JobSpec, float]:
    """The job spec and TTL for a /v1/jobs submission."""
    params = SamplingParams(
        max_tokens=req.max_tokens or settings.default_max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        stop=tuple(req.stop or ()),
        ignore_eos=req.ignore_eos,
    )
    messages = tuple(req.messages) if req.messages is not None else None
    return make_spec(
        owner,
        settings,
        params,
        req.prompt,
        messages,
        model=req.model,
        priority=req.priority,
        ttl_s=req.ttl_s,
        watched=watched or req.abandon_on_disconnect,
        constraint=req.response_format.constraint() if req.response_format else None,
    )


def served_model(settings: Settings, name: str | None) -> str:
    """The model a request names (the default model if it names none), or ModelNotFound."""
    if name is None:
        return settings.model_name
    if settings.model_named(name) is None:
        served = ", ".join(f"'{m.name}'" for m in settings.catalog)
        shown = name if len(name) <= 100 else name[:100] + "…"
        raise ModelNotFound(f"the model '{shown}' does not exist; this server serves {served}", param="model")
    return name


def default_priority(user: User | None) -> Priority:
    """The class a user's jobs get when a request names none; the local user's and visitors' are interactive."""
    return user.priority if user else "interactive"


def _chars(m: Message) -> int:
    return len(m.content) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls)


def make_spec(
    owner: str,
    settings: Settings,
    params: SamplingParams,
    prompt: str | None,
    messages: tuple[Message, ...] | None,
    *,
    model: str | None = None,
    priority: Priority | None = None,
    ttl_s: float | None = None,
    watched: bool = False,
    stream: bool = False,
    response: ResponseFields | None = None,
    constraint: Constraint | None = None,
    tools: tuple[Tool, ...] = (),
) -> tuple[JobSpec, float]:
    """Apply the server's catalog and limits (model, prompt size, max_tokens, TTL) and the owner's default
    priority; every way in goes through here."""
    model = served_model(settings, model)
    own = default_priority(settings.user_named(owner))
    if priority == "interactive" and own == "batch":  # a key's class is its ceiling, not a suggestion
        raise Forbidden("this API key submits batch work only (its priority in the keys file)", param="priority")
    priority = priority or own
    size = len(prompt) if prompt is not None else sum(_chars(m) for m in messages or ())
    param = "prompt" if prompt is not None else "messages"
    if size == 0:  # nothing to generate from: refused here rather than failed by the worker
        raise InvalidRequest("the prompt is empty" if prompt is not None else "every message is empty", param=param)
    size += sum(len(t.description) + len(json.dumps(t.parameters)) for t in tools)  # told to the model too
    if size > settings.max_prompt_chars:
        raise PromptTooLarge(
            f"the prompt has {size} characters; this server accepts at most {settings.max_prompt_chars}", param=param
        )
    if params.max_tokens > settings.max_tokens_limit:
        raise InvalidRequest(f"max_tokens may be at most {settings.max_tokens_limit}", param="max_tokens")
    ttl_s = ttl_s or settings.job_ttl_s
    if ttl_s > settings.job_ttl_s:
        raise InvalidRequest(f"ttl_s may be at most {settings.job_ttl_s:g}", param="ttl_s")
    spec = JobSpec(
        owner=owner,
        model=model,
        prompt=prompt,
        messages=messages,
        params=params,
        priority=priority,
        watched=watched,
        stream=stream,
        response=response,
        constraint=constraint,
        tools=tools,
    )
    return spec, ttl_s
