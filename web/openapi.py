"""The OpenAPI 3.1 document of the app, assembled by walking its routes: each view declares its operation where its
route is (web/apidoc.py's `@documented`), and each error's status, type, headers and meaning come from its class
(web/errors.py), as the error handlers answer it.

pydantic writes every schema the operations name (the request models the views validate with, the answer models of
web/responses.py and web/openai/); apispec assembles the document around them: components, security, and the
operations at the paths Flask itself routes. A route that declares nothing fails the document, so none is left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from apispec import APISpec
from flask import Flask
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema
from werkzeug.routing import Rule

from tasks.settings import Settings
from web import responses
from web.apidoc import HEADERS, HTML, JSON, PATH, Operation, Reply, Schema, Text, operations_of
from web.errors import (
    ANTHROPIC_BLUEPRINTS,
    ANTHROPIC_TYPES,
    header_names,
    meaning,
    openai_category,
    openai_shaped,
    shown_status,
    status_of,
    type_of,
)

if TYPE_CHECKING:  # (the models models_json_schema takes, and keys its refs by)
    from pydantic._internal._dataclasses import PydanticDataclass

TAGS = [
    {"name": "jobs"},
    {"name": "openai", "description": "OpenAI-compatible"},
    {"name": "anthropic", "description": "Anthropic's Messages API"},
    {"name": "health"},
    {
        "name": "pages",
        "description": "HTML pages for a browser: its session cookie says who it is, and every "
        "form it posts carries the session's CSRF token",
    },
    {"name": "dashboard", "description": "The queue dashboard: another user's jobs are only ever counted"},
    {"name": "docs", "description": "This document, as JSON and as a page"},
]
METHODS = ("get", "post", "put", "patch", "delete")  # a path's operations in this order
RULE_ARGUMENT = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")  # `<job_id>`, `<int:n>`


@dataclass(frozen=True)
class Route:
    """One operation the app serves: its path and method, and what its view declared for it."""

    path: str
    method: str
    blueprint: str | None
    arguments: list[str]  # the rule's, in order
    operation: Operation


@dataclass(frozen=True)
class Component:
    """A pydantic model an operation names, as it is read (a request's body) or written (an answer)."""

    model: type[BaseModel]
    mode: JsonSchemaMode


def build(app: Flask, settings: Settings) -> dict[str, Any]:
    """The whole document for this app."""
    spec = APISpec(
        title="onelane",
        version=_version(),
        openapi_version="3.1.0",
        info={"description": _overview(settings)},
        security=[{"bearerAuth": []}, {}],  # {}: none needed in local mode
        tags=TAGS,
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
    writer = Writer(settings)
    written = [(route, writer.operation(route)) for route in routes(app)]
    refs, schemas = models_json_schema(
        [(c.model, c.mode) for c in writer.named], ref_template="#/components/schemas/{model}"
    )
    for c in writer.named:
        if c.mode == "validation":
            _server_rules(schemas["$defs"][refs[(c.model, c.mode)]["$ref"].rsplit("/", 1)[-1]], settings)
    for name, schema in schemas["$defs"].items():
        spec.components.schema(name, schema)
    paths: dict[str, dict[str, Any]] = {}
    for route, operation in written:
        paths.setdefault(route.path, {})[route.method] = _refer(operation, refs)
    for path, item in paths.items():
        spec.path(path=path, operations=item)
    return spec.to_dict()


def routes(app: Flask) -> Iterator[Route]:
    """Every operation the app serves (but its static files), with what its view declared for it."""
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        declared = operations_of(app.view_functions[rule.endpoint])
        served = [m for m in METHODS if m.upper() in (rule.methods or ())]
        stray = [op.method for op in declared if op.method is not None and op.method not in served]
        if stray:
            raise LookupError(f"{rule.endpoint} declares {stray}, which {rule.rule} does not serve")
        blueprint = rule.endpoint.rpartition(".")[0] or None
        for method in served:
            yield Route(_path(rule), method, blueprint, RULE_ARGUMENT.findall(rule.rule), _one(declared, method, rule))


def _one(declared: list[Operation], method: str, rule: Rule) -> Operation:
    """The operation a view declared for `method` (or for no method in particular)."""
    found = [op for op in declared if op.method == method] or [op for op in declared if op.method is None]
    if len(found) != 1:
        raise LookupError(f"{method.upper()} {rule.rule} ({rule.endpoint}): declare it once, with @documented")
    return found[0]


def _path(rule: Rule) -> str:
    """The OpenAPI path of a Flask rule: `/v1/jobs/<job_id>` -> `/v1/jobs/{job_id}`."""
    return RULE_ARGUMENT.sub(r"{\1}", rule.rule)


class Writer:
    """Writes operations as OpenAPI has them, for one server's settings; each pydantic model they name is left as a
    Component, collected in `named` (in order) for pydantic to write, and replaced by its $ref at the end."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.named: dict[Component, None] = {}

    def operation(self, route: Route) -> dict[str, Any]:
        """The operation: its parameters (the rule's path ones first), its body, its answers and its errors."""
        op = route.operation
        if op.tag not in {tag["name"] for tag in TAGS}:
            raise LookupError(f"{op.id}: its tag {op.tag!r} is not one of web/openapi.py's TAGS")
        written: dict[str, Any] = {"operationId": op.id, "tags": [op.tag], "summary": op.summary}
        if op.public:
            written["security"] = []
        if op.description:
            written["description"] = self.text(op.description)
        parameters = [_path_parameter(name) for name in route.arguments] + [self.schema(p) for p in op.params]
        if parameters:
            written["parameters"] = parameters
        if op.body is not None:  # its models are read (validated), not written
            body = {op.body_media: {"schema": self.schema(op.body, "validation")}}
            written["requestBody"] = {"required": True, "content": body}
        written["responses"] = self.responses(op, route.blueprint)
        return written

    def responses(self, op: Operation, blueprint: str | None) -> dict[str, Any]:
        """Its answers, and its errors by the status each is answered with, in the order of their statuses."""
        written = {status: self.reply(reply) for status, reply in op.answers.items()}
        faults: dict[int, dict[type[Exception], Failure]] = {}
        for fault, page in [(f, False) for f in op.errors] + [(f, True) for f in op.refusals]:
            kind, note = fault if isinstance(fault, tuple) else (fault, None)
            status = shown_status(status_of(kind), blueprint)
            if status in written:
                raise LookupError(f"{op.id}: {status} is declared both as an answer and as {kind.__name__}'s")
            group = faults.setdefault(status, {})
            group[kind] = group.get(kind, Failure(kind, note)).answered(page)
        for status, group in faults.items():
            written[status] = self.errors(status, list(group.values()), blueprint)
        return {str(status): written[status] for status in sorted(written)}

    def errors(self, status: int, group: list[Failure], blueprint: str | None) -> dict[str, Any]:
        """One status's errors as an answer: what each class means, the body it comes in (the edge's JSON, the
        view's page, or either) and the headers they carry (required when every one of them does)."""
        content: dict[str, Schema] = {}
        if any(f.raised for f in group):
            content[JSON] = (
                responses.AnthropicError
                if blueprint in ANTHROPIC_BLUEPRINTS
                else responses.OpenAIError
                if openai_shaped(blueprint)
                else responses.Error
            )
        if any(f.page for f in group):
            content[HTML] = {"type": "string"}
        parts = [self.failure(f, mixed=len(content) > 1) for f in group]
        if blueprint in ANTHROPIC_BLUEPRINTS:
            parts.insert(0, f"Anthropic's `type`: `{ANTHROPIC_TYPES.get(status, 'api_error')}`; onelane's reason:")
        elif openai_shaped(blueprint):
            parts.insert(0, f"OpenAI's `type`: `{openai_category(status)}`; its `code`:")
        answer: dict[str, Any] = {
            "description": "\n\n".join(parts),  # a paragraph each
            "content": {media: {"schema": self.schema(schema)} for media, schema in content.items()},
        }
        names = list(dict.fromkeys(name for f in group for name in header_names(f.kind)))
        if names:
            every = {name: all(name in header_names(f.kind) for f in group) for name in names}
            answer["headers"] = {name: {**HEADERS[name], "required": every[name]} for name in names}
        return answer

    def failure(self, f: Failure, mixed: bool) -> str:
        """`type`: what the class means, and what raises it on this route; where a status comes both as JSON and as
        the view's page, which one this error comes as."""
        text = f"`{type_of(f.kind)}`: {meaning(f.kind).rstrip('.')}."
        if f.note is not None:
            text += f" Here: {self.text(f.note)}."
        if mixed and f.page != f.raised:
            text += " (The page again.)" if f.page else " (As JSON.)"
        return text

    def reply(self, reply: Reply) -> dict[str, Any]:
        """An answer the view declared."""
        written: dict[str, Any] = {"description": self.text(reply.description)}
        if reply.content:
            written["content"] = {media: {"schema": self.schema(s)} for media, s in reply.content.items()}
        if reply.headers:
            written["headers"] = {name: _header(name, how) for name, how in reply.headers.items()}
        if reply.links:
            written["links"] = reply.links
        return written

    def text(self, text: Text) -> str:
        """A description, for this server."""
        return text if isinstance(text, str) else text(self.settings)

    def schema(self, value: Schema, mode: JsonSchemaMode = "serialization") -> Any:
        """`value` with each function of the settings called, and each model left as a Component (and named)."""
        if isinstance(value, type) and issubclass(value, BaseModel):
            component = Component(value, mode)
            self.named[component] = None
            return component
        if callable(value):
            return self.schema(value(self.settings), mode)
        if isinstance(value, dict):
            return {key: self.schema(v, mode) for key, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.schema(v, mode) for v in value]
        return value


@dataclass(frozen=True)
class Failure:
    """An error class one status of an operation answers: as the edge's JSON (`raised`), as the view's page, or both."""

    kind: type[Exception]
    note: Text | None
    raised: bool = False
    page: bool = False

    def answered(self, page: bool) -> Failure:
        return Failure(self.kind, self.note, self.raised or not page, self.page or page)


def _refer(
    value: Any, refs: dict[tuple[type[BaseModel] | type[PydanticDataclass], JsonSchemaMode], dict[str, Any]]
) -> Any:
    """`value` with each Component replaced by its $ref."""
    if isinstance(value, Component):
        return refs[(value.model, value.mode)]
    if isinstance(value, dict):
        return {key: _refer(v, refs) for key, v in value.items()}
    if isinstance(value, list):
        return [_refer(v, refs) for v in value]
    return value


def _path_parameter(name: str) -> dict[str, Any]:
    if name not in PATH:
        raise LookupError(f"the path parameter {name!r} has no description in web/apidoc.py's PATH")
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}, "description": PATH[name]}


def _header(name: str, how: bool | str) -> dict[str, Any]:
    """A header of an answer: always sent (True, or a description of its value there) or sometimes (False)."""
    return {**HEADERS[name], "required": how is not False, **({"description": how} if isinstance(how, str) else {})}


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
