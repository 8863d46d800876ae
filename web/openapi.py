"""The OpenAPI 3.1 document of the API, generated from the pydantic models the handlers validate with.

pydantic writes every schema (the request models of web/schemas.py and web/openai/, the response models of
web/responses.py and web/openai/); apispec assembles the document around them: components, security, and one operation per
route, the API's (web/operations.py) and a browser's (web/page_operations.py), at the path Flask itself routes
(read from the app's URL rules, so a renamed route cannot drift).
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from apispec import APISpec
from flask import Flask
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from tasks.settings import Settings
from web import responses
from web.openai import answers, file_answers, response_answers
from web.openai.batches import BatchRequest
from web.openai.chat_schemas import ChatRequest, CompletionRequest
from web.openai.response_schemas import ResponseRequest
from web.operations import operations
from web.page_operations import TAGS, page_operations
from web.schemas import SubmitJob

REQUESTS: tuple[type[BaseModel], ...] = (SubmitJob, ChatRequest, CompletionRequest, ResponseRequest, BatchRequest)
ANSWERS: tuple[type[BaseModel], ...] = (
    responses.Job,
    responses.JobList,
    responses.Error,
    responses.OpenAIError,
    answers.ModelList,
    answers.ChatCompletion,
    answers.Completion,
    answers.ChatCompletionChunk,
    answers.CompletionChunk,
    responses.QueuedEvent,
    responses.StartedEvent,
    responses.TokenEvent,
    responses.RequeuedEvent,
    responses.Health,
    responses.Ready,
    responses.NotReady,
    response_answers.OpenAIResponse,
    response_answers.InputItemList,
    response_answers.ResponseStreamEvent,
    file_answers.FileObject,
    file_answers.FileList,
    file_answers.FileDeleted,
    file_answers.Batch,
    file_answers.BatchList,
)


def build(app: Flask, settings: Settings) -> dict[str, Any]:
    """The whole document for this app."""
    spec = APISpec(
        title="onelane",
        version=_version(),
        openapi_version="3.1.0",
        info={"description": _overview(settings)},
        security=[{"bearerAuth": []}, {}],  # {}: none needed in local mode
        tags=[{"name": "jobs"}, {"name": "openai", "description": "OpenAI-compatible"}, {"name": "health"}, *TAGS],
    )
    spec.components.security_scheme(
        "bearerAuth",
        {
            "type": "http",
            "scheme": "bearer",
            "description": "With API keys configured, every API request needs `Authorization: Bearer <key>` (else 401); "
            "in local mode (no keys) none is needed.",
        },
    )
    refs, schemas = models_json_schema(
        [(m, "validation") for m in REQUESTS] + [(m, "serialization") for m in ANSWERS],
        ref_template="#/components/schemas/{model}",
    )
    for model in REQUESTS:
        _server_rules(schemas["$defs"][refs[(model, "validation")]["$ref"].rsplit("/", 1)[-1]], settings)
    for name, schema in schemas["$defs"].items():
        spec.components.schema(name, schema)

    def ref(model: type[BaseModel]) -> dict[str, Any]:
        return refs[(model, "validation" if model in REQUESTS else "serialization")]

    paths: dict[str, dict[str, Any]] = {}
    for endpoint, method, operation in operations(ref, settings) + page_operations(ref, settings):
        paths.setdefault(_path(app, endpoint), {})[method] = operation
    for path, item in paths.items():
        spec.path(path=path, operations=item)
    return spec.to_dict()


def _server_rules(schema: dict[str, Any], s: Settings) -> None:
    """Add to a request's schema what this server's settings decide: the models it serves, and its limits."""
    rules = {
        "model": ("string", {"enum": [m.name for m in s.catalog]}),
        "prompt": ("string", {"maxLength": s.max_prompt_chars}),
        "max_tokens": ("integer", {"maximum": s.max_tokens_limit}),
        "max_completion_tokens": ("integer", {"maximum": s.max_tokens_limit}),
        "ttl_s": ("number", {"maximum": s.job_ttl_s}),
    }
    for field, prop in schema["properties"].items():
        kind, rule = rules.get(field, ("", {}))
        for branch in prop.get("anyOf", [prop]):
            if branch.get("type") == kind:
                branch.update(rule)


def _path(app: Flask, endpoint: str) -> str:
    """The OpenAPI path of a Flask endpoint: `/v1/jobs/<job_id>` -> `/v1/jobs/{job_id}`."""
    rule = next(iter(app.url_map.iter_rules(endpoint)))
    return re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)


def _version() -> str:
    try:
        return version("onelane")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0"


def _overview(s: Settings) -> str:
    return (
        "A fair, bounded job queue in front of one GPU running LLM inference with MLX. Every generation is a job; "
        "the OpenAI-compatible endpoints are jobs too, in the same queue.\n\n"
        f"This server's limits: prompts up to {s.max_prompt_chars} characters; `max_tokens` up to "
        f"{s.max_tokens_limit} (default {s.default_max_tokens}); a job waits at most {s.job_ttl_s:g} s "
        f"(`ttl_s`); {s.max_queue} waiting jobs in all and {s.max_queued_per_user} per user.\n\n"
        'Errors are JSON, `{"error": {"type", "message", "param"}}` (on the OpenAI endpoints, OpenAI\'s '
        '`{"error": {"message", "type", "param", "code"}}`), never a stack trace. Any request may also be '
        "answered `503 unavailable` with `Retry-After` while Redis is unreachable."
    )
