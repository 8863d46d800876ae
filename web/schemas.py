"""Request bodies, validated with pydantic; unknown fields are refused, not ignored."""

from __future__ import annotations

import json
import re
import time
from typing import Any, Literal

from flask import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasks.context import window_of
from tasks.errors import Forbidden, InvalidJSON, InvalidRequest, ModelNotFound, PromptTooLarge
from tasks.image_fit import fit_of
from tasks.images import ImageRules, checked
from tasks.job import NAME_PATTERN, JobSpec, Message, Pooled, Priority, ResponseFields, SamplingParams
from tasks.model_kind import NAMES, Kind
from tasks.settings import Settings
from tasks.structured import Constraint, Tool, ToolCall, json_constraint
from tasks.token_count import COUNTS
from tasks.users import User
from web.body import raw as body_bytes
from web.content import Content, read_content


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


class SubmitMessage(BaseModel):
    """A message of a /v1/jobs conversation: the job's own message record, whose content may also be parts of text
    and images (as chat completions take it)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: Content
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = Field(None, pattern=NAME_PATTERN)

    def to_message(self, i: int) -> Message:
        text, images = read_content(self.content, self.role, f"messages.{i}.content")
        return Message(
            role=self.role,
            content=text,
            tool_calls=tuple(self.tool_calls),
            tool_call_id=self.tool_call_id,
            name=self.name,
            images=images,
        )


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
    messages: list[SubmitMessage] | None = Field(None, min_length=1)
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


YIELD_EVERY = 2_000  # strings of a body checked between two turns of the other requests
MAX_DEPTH = 32  # deeper than any request needs, and far from the recursion limit of what reads it next
STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes and all
NOT_BRACKET = re.compile(r"[^][{}]+")
INNERMOST = re.compile(r"\[\]|\{\}")
#: an escaped surrogate that is not one of a pair (or a false alarm, such as an escaped backslash before "ud800")
LONE_SURROGATE = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F]"
)


def json_body(request: Request) -> dict[str, Any]:
    """The body as a JSON object of valid text, or InvalidJSON."""
    if not request.is_json:
        raise InvalidJSON("send a JSON object with 'Content-Type: application/json'")
    raw = body_bytes(request)
    try:
        text = raw.decode(json.detect_encoding(raw))  # (UTF-8, or the UTF-16 or -32 that JSON's bytes may be)
    except UnicodeDecodeError:
        raise InvalidJSON("the body is not valid JSON: it is not UTF-8 text") from None
    body = loads_checked(text)
    if not isinstance(body, dict):
        raise InvalidJSON("the body must be a JSON object")
    return body


def loads_checked(text: str, what: str = "the body") -> Any:
    """`text` as JSON of valid text, or InvalidJSON naming `what`: not JSON (`NaN` is not), nested more than
    MAX_DEPTH levels, or holding a lone UTF-16 surrogate. Both are read off the text with regular expressions (C),
    before and beside the parse: a body of 300 KB costs the web's loop milliseconds, not the walk of every value."""
    _check_nesting(text, what)
    try:
        value = json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError):
        raise InvalidJSON(f"{what} is not valid JSON") from None
    if ("\\ud" in text or "\\uD" in text) and LONE_SURROGATE.search(text):  # (rare: only then are strings walked)
        _check_strings(value, what)
    return value


def _check_nesting(text: str, what: str) -> None:
    """InvalidJSON if `text`'s arrays and objects nest more than MAX_DEPTH deep (its strings' brackets aside)."""
    brackets = NOT_BRACKET.sub("", STRING.sub("", text))
    for _ in range(MAX_DEPTH):
        brackets, pairs = INNERMOST.subn("", brackets)
        if not pairs:
            return  # (what is left, if anything, is not JSON: the parse says so)
    if INNERMOST.search(brackets):
        raise InvalidJSON(f"{what} is nested more than {MAX_DEPTH} levels deep")


def _not_json(constant: str) -> None:
    """NaN and Infinity: Python's json reads them, but they are not JSON."""
    raise ValueError(f"{constant} is not JSON")


def _check_strings(value: Any, what: str) -> None:
    """InvalidJSON if a string of `value`, key or value, is not valid Unicode text."""
    stack = [value]
    seen = 0
    while stack:
        value = stack.pop()
        seen += 1
        if seen % YIELD_EVERY == 0:
            time.sleep(0)  # under gevent (onelane web), a big body lets the process's other requests run meanwhile
        if isinstance(value, str):
            try:
                value.encode()
            except UnicodeEncodeError:  # a lone surrogate ("\ud800") parses, but Redis and the model cannot take it
                raise InvalidJSON(
                    f"a string of {what} holds a lone UTF-16 surrogate; send valid Unicode text"
                ) from None
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


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
        if isinstance(body, dict):
            body = body.get(part)
        elif isinstance(part, int):  # (always, for a list: see above)
            body = body[part] if part < len(body) else None
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
    messages = tuple(m.to_message(i) for i, m in enumerate(req.messages)) if req.messages is not None else None
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


def served_model(settings: Settings, name: str | None, kind: Kind = "generate") -> str:
    """The model a request names (if it names none: the default model, or else the first of the kind it asks of),
    or ModelNotFound; one of another kind is an InvalidRequest that says which models are of its kind."""
    of_kind = [m.name for m in settings.catalog if m.kind == kind]
    if name is None:
        if settings.model_named(settings.model_name).kind == kind:  # type: ignore[union-attr]  # (the default model is in the catalog)
            return settings.model_name
        if not of_kind:
            raise InvalidRequest(f"this server serves no {NAMES[kind].split(' ', 1)[1]}", param="model")
        return of_kind[0]
    config = settings.model_named(name)
    if config is None:
        served = ", ".join(f"'{m.name}'" for m in settings.catalog)
        shown = name if len(name) <= 100 else name[:100] + "…"
        raise ModelNotFound(f"the model '{shown}' does not exist; this server serves {served}", param="model")
    if config.kind != kind:
        these = ", ".join(f"'{n}'" for n in of_kind) or "none"
        raise InvalidRequest(
            f"the model '{name}' is {NAMES[config.kind]}, not {NAMES[kind]}: this endpoint takes {these}",
            param="model",
        )
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
    count: bool = False,
    field: str = "messages",
    clip: bool = False,
    line: bool = False,
) -> tuple[JobSpec, float]:
    """Apply the server's catalog and limits (model, prompt size and tokens, max_tokens, TTL) and the owner's default
    priority; every way in goes through here. `clip`: a max_tokens past the server's limit is served at the limit
    (Anthropic's clients ask for 32,000 by default), not refused. `line`: a batch's line, whose prompt is counted as
    it joins the batch (a file of 50,000 lines is not counted as it is read)."""
    model = served_model(settings, model)
    priority = _priority(settings, owner, priority)
    param = "prompt" if prompt is not None else field  # (the request's name for its conversation)
    _check_size(settings, prompt, messages, tools, param)
    if params.max_tokens > settings.max_tokens_limit and clip:
        params = params.model_copy(update={"max_tokens": settings.max_tokens_limit})
    elif params.max_tokens > settings.max_tokens_limit:
        raise InvalidRequest(f"max_tokens may be at most {settings.max_tokens_limit}", param="max_tokens")
    if messages and any(m.images for m in messages):
        messages = _read_images(settings, model, messages, param)
    ttl_s = _ttl(settings, ttl_s)
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
        count=count,
    )
    return (spec if count or line else counted(settings, spec, param)), ttl_s


def counted(settings: Settings, spec: JobSpec, param: str) -> JobSpec:
    """`spec` with its prompt's tokens as its model reads them (tasks/token_count.py), if they can be counted here;
    ContextLengthExceeded, naming `param`, if they do not fit its model (tasks/context.py)."""
    tokens = COUNTS.count(settings, spec)
    if tokens is None:
        return spec
    window_of(settings, spec.model).check(tokens, param)
    return spec.model_copy(update={"prompt_tokens": tokens})


def _check_size(
    settings: Settings, prompt: str | None, messages: tuple[Message, ...] | None, tools: tuple[Tool, ...], param: str
) -> None:
    """Refuse a prompt with nothing to generate from (no text, no image), or longer than the server accepts: its
    characters, or its messages', and its tools' (told to the model too); `param` names it in the refusal."""
    size = len(prompt) if prompt is not None else sum(_chars(m) for m in messages or ())
    if size == 0 and not any(m.images for m in messages or ()):  # nothing to generate from: refused here
        raise InvalidRequest("the prompt is empty" if prompt is not None else "every message is empty", param=param)
    size += sum(len(t.description) + len(json.dumps(t.parameters)) for t in tools)  # told to the model too
    if size > settings.max_prompt_chars:
        raise PromptTooLarge(
            f"the prompt has {size} characters; this server accepts at most {settings.max_prompt_chars}", param=param
        )


def _read_images(settings: Settings, model: str, messages: tuple[Message, ...], param: str) -> tuple[Message, ...]:
    """The messages' images, read and bounded (tasks/images.py), for a model that reads images; else a 400 that
    names the model and those that do."""
    config = settings.model_named(model)
    if config is None or not config.vision:
        seeing = ", ".join(f"'{m.name}'" for m in settings.catalog if m.vision)
        raise InvalidRequest(
            f"the model '{model}' reads text only: it cannot read the images in this request; "
            + (f"models that read images: {seeing}" if seeing else "this server serves no model that reads images"),
            param=param,
        )
    rules = ImageRules(
        max_bytes=settings.image_max_bytes,
        max_pixels=settings.image_max_pixels,
        max_images=settings.max_images,
        hosts=settings.image_hosts,
        private_hosts=settings.image_private_hosts,
        fetch_s=settings.image_fetch_s,
        fit=fit_of(config.path),
    )
    return checked(messages, rules, param)


def make_pooled_spec(
    owner: str, settings: Settings, pooled: Pooled, model: str | None, *, batch: bool = False
) -> tuple[JobSpec, float]:
    """An embedding or rerank job (`pooled.kind`) and its TTL: the catalog, the prompt bound (over all its inputs)
    and the owner's class as for any job; watched by its request, or a batch's line (batch class, nobody watching)."""
    model = served_model(settings, model, pooled.kind)
    priority = _priority(settings, owner, "batch" if batch else None)
    size = len(pooled.query or "") + sum(len(t) for t in pooled.texts)
    if size > settings.max_prompt_chars:
        what = "documents and query have" if pooled.kind == "rerank" else "inputs have"
        raise PromptTooLarge(
            f"the {what} {size} characters (or tokens) in all; this server accepts at most {settings.max_prompt_chars}",
            param="documents" if pooled.kind == "rerank" else "input",
        )
    spec = JobSpec(owner=owner, model=model, priority=priority, watched=not batch, pooled=pooled)
    return spec, _ttl(settings, None)


def _priority(settings: Settings, owner: str, asked: Priority | None) -> Priority:
    """The class of a job `owner` submits, asking for `asked` (None: the owner's default)."""
    own = default_priority(settings.user_named(owner))
    if asked == "interactive" and own == "batch":  # a key's class is its ceiling, not a suggestion
        raise Forbidden("this API key submits batch work only (its priority in the keys file)", param="priority")
    return asked or own


def _ttl(settings: Settings, ttl_s: float | None) -> float:
    ttl_s = ttl_s or settings.job_ttl_s
    if ttl_s > settings.job_ttl_s:
        raise InvalidRequest(f"ttl_s may be at most {settings.job_ttl_s:g}", param="ttl_s")
    return ttl_s
