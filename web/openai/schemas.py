"""What every OpenAI request shares: strict models, unsupported fields refused by name, service tiers, and how a
request's tools and format become its answer's grammar.

Unsupported fields get a 400 rather than being silently ignored; a few are let through with their neutral value.
The requests themselves: web/openai/chat/schemas.py (chat and completions, on web/openai/chat/sampling.py),
web/openai/responses/schemas.py (the Responses API) and web/openai/batches/routes.py (the Batch API).
"""

from __future__ import annotations

import reprlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from werkzeug.exceptions import RequestEntityTooLarge

from tasks.errors import (
    ContextLengthExceeded,
    Forbidden,
    InvalidJSON,
    InvalidRequest,
    JobCancelled,
    JobExpired,
    JobFailed,
    ModelNotFound,
    ModelUnavailable,
    PromptTooLarge,
    QueueFull,
    QuotaExceeded,
    Unauthorized,
    Unavailable,
)
from tasks.job import Priority
from tasks.structured import Constraint, Tool, tools_constraint
from web.schemas import ResponseFormat, parse

#: Fields onelane accepts only with their neutral value: anything else would change the answer's meaning. (`echo`
#: and `best_of` are the legacy completions'; chat lets their neutral values through, as it always did.)
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "echo": (False, None),
    "best_of": (1, None),
    "store": (False, None),
    "suffix": (None, ""),
}


#: OpenAI's service tiers as onelane's priority classes; None: the caller's own default class.
TIERS: dict[str, Priority | None] = {"auto": None, "default": None, "flex": "batch", "priority": "interactive"}

STRICT = ConfigDict(extra="forbid", strict=True)  # as OpenAI: `true` is not 1, "0.5" is not 0.5


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


#: What a request that generates may be answered instead (/openapi.json): refused, or its job ended otherwise.
REQUEST_ERRORS = (
    InvalidJSON,
    (
        InvalidRequest,
        "wrong types or values out of range, fields that do not go together (`top_logprobs` without `logprobs`, "
        "`best_of` below `n` or streamed, `max_tokens` 0 without `echo`), a JSON schema that cannot be enforced "
        "(`response_format`'s, a tool's `parameters`), a field onelane does not support (`functions`, `store` true, "
        "`suffix` …), or a `logit_bias` token id beyond the model's vocabulary (found when the job runs), named in "
        "`param`",
    ),
    Unauthorized,
    Forbidden,
    ModelNotFound,
    JobCancelled,
    ContextLengthExceeded,
    PromptTooLarge,
    RequestEntityTooLarge,
    QuotaExceeded,
    JobFailed,
    QueueFull,
    ModelUnavailable,
    JobExpired,
    Unavailable,
)


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
        # a named function is called once (as vLLM does, and as a client that forces one reads it), unless the
        # client asked for several calls itself; otherwise several, unless it asked for one
        several = parallel is True if choice not in ("auto", "required") else parallel is not False
        return tools_constraint(tuple(tools), choice, several), tuple(tools)
    if choice not in ("auto", "none"):
        raise InvalidRequest("tool_choice asks for a tool, but tools is empty", param="tool_choice")
    return (response_format.constraint() if response_format else None), ()


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
