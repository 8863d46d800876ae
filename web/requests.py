"""What every API room's requests share (web/openai/, web/anthropic/): strict parsing, where a field the API names
but onelane does not serve is refused by name unless it holds its neutral value; the errors a request that generates
may be answered with instead (/openapi.json); and what its tools and format ask its answer to be (its grammar)."""

from __future__ import annotations

import reprlib
from typing import Any

from pydantic import BaseModel
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
from tasks.structured import Constraint, Tool, tools_constraint
from web.schemas import ResponseFormat, parse

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


def parse_strict(model: type[BaseModel], body: dict[str, Any], neutral: dict[str, tuple[Any, ...]]) -> Any:
    """Validate, refusing unsupported fields by name; a field `model` does not know but `neutral` lists is let
    through (and dropped) with one of its neutral values, of the same JSON type."""
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
