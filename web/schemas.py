"""Request bodies, validated with pydantic; unknown fields are refused, not ignored."""

from __future__ import annotations

from typing import Any

from flask import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasks.errors import InvalidJSON, InvalidRequest, PromptTooLarge
from tasks.job import JobSpec, Message, SamplingParams
from tasks.settings import Settings


class SubmitJob(BaseModel):
    """POST /v1/jobs: exactly one of prompt or messages, plus sampling options."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str | None = None
    messages: list[Message] | None = Field(None, min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    ttl_s: float | None = Field(None, gt=0)
    abandon_on_disconnect: bool = False

    @field_validator("temperature", "top_p", "ttl_s", mode="before")
    @classmethod
    def _int_is_a_float(cls, value: Any) -> Any:
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

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


def json_body(request: Request) -> dict[str, Any]:
    """The body as a JSON object, or InvalidJSON."""
    if not request.is_json:
        raise InvalidJSON("send a JSON object with 'Content-Type: application/json'")
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise InvalidJSON("the body must be a JSON object")
    return body


def parse(model: type[BaseModel], body: dict[str, Any]) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        message = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise InvalidRequest(message, param=where or None) from None


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
    return make_spec(owner, settings, params, req.prompt, messages, req.ttl_s, watched or req.abandon_on_disconnect)


def make_spec(
    owner: str,
    settings: Settings,
    params: SamplingParams,
    prompt: str | None,
    messages: tuple[Message, ...] | None,
    ttl_s: float | None = None,
    watched: bool = False,
) -> tuple[JobSpec, float]:
    """Apply the server's limits (prompt size, max_tokens, TTL); every way in goes through here."""
    size = len(prompt) if prompt is not None else sum(len(m.content) for m in messages or ())
    if size > settings.max_prompt_chars:
        raise PromptTooLarge(
            f"the prompt has {size} characters; this server accepts at most {settings.max_prompt_chars}",
            param="prompt" if prompt is not None else "messages",
        )
    if params.max_tokens > settings.max_tokens_limit:
        raise InvalidRequest(f"max_tokens may be at most {settings.max_tokens_limit}", param="max_tokens")
    ttl_s = ttl_s or settings.job_ttl_s
    if ttl_s > settings.job_ttl_s:
        raise InvalidRequest(f"ttl_s may be at most {settings.job_ttl_s:g}", param="ttl_s")
    spec = JobSpec(
        owner=owner, model=settings.model_name, prompt=prompt, messages=messages, params=params, watched=watched
    )
    return spec, ttl_s
