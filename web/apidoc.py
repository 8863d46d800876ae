"""What a route promises, declared on its view: `@documented(...)` under the route's own decorator names the
operation, its body, its answers and the errors it may raise. web/openapi.py walks the app's routes and assembles
/openapi.json from these declarations; nothing here builds the document, so a view imports only this.

A schema here is plain JSON schema in which a pydantic model stands for its component (a `$ref`), and any value may be
a function of the server's settings (a limit, the served models, a description that names them): the document is
built for one server.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tasks.settings import Settings

JSON, SSE, HTML, TEXT = "application/json", "text/event-stream", "text/html", "text/plain"
FORM, MULTIPART = "application/x-www-form-urlencoded", "multipart/form-data"

Text = str | Callable[[Settings], str]  # a description, or one the server's settings decide
Schema = Any  # JSON schema; a pydantic model in it stands for its component, a function of the settings for its value
Fault = type[Exception] | tuple[type[Exception], Text]  # an error class, or one with what raises it on this route
View = TypeVar("View", bound=Callable[..., Any])

ATTRIBUTE = "__onelane_operations__"  # where a view keeps what it declared

#: The headers the API answers with, described once.
HEADERS = {
    "Retry-After": {"description": "whole seconds until a place should free up", "schema": {"type": "integer"}},
    "Location": {"description": "the job's URL", "schema": {"type": "string"}},
    "WWW-Authenticate": {"description": 'Bearer realm="onelane"', "schema": {"type": "string"}},
    "x-onelane-job-id": {"description": "the job behind this answer (`n`: the first's)", "schema": {"type": "string"}},
    "x-onelane-job-ids": {
        "description": "with several answers (`n`, `best_of`): every job behind them, comma-separated, in order",
        "schema": {"type": "string"},
    },
    "x-queue-time": {"description": "seconds the job waited (non-streaming answers)", "schema": {"type": "string"}},
}

#: The routes' path parameters, by the name their rules give them: each route's are documented from its rule.
PATH = {
    "job_id": "the job's id (`job_…`); another user's job is 404, as one that does not exist",
    "file_id": "the file's id (`file-…`)",
    "batch_id": "the batch's id (`batch_…`); another user's batch is 404, as one that does not exist",
    "rid": "the response's id (`resp_…`)",
    "digest": "the image's SHA-256, in hexadecimal (as the job's messages name it)",
}


@dataclass(frozen=True)
class Reply:
    """An answer of an operation: what it means, its body's schema by media type, the headers it carries (name ->
    True: always, False: sometimes, or a description of its value there, always) and its links."""

    description: Text
    content: dict[str, Schema] = field(default_factory=dict)
    headers: dict[str, bool | str] = field(default_factory=dict)
    links: dict[str, Any] = field(default_factory=dict)


def reply(
    description: Text,
    schema: Schema = None,
    media: str = JSON,
    headers: dict[str, bool | str] | None = None,
    links: dict[str, Any] | None = None,
) -> Reply:
    """An answer whose body (if any) is of one media type."""
    return Reply(description, {} if schema is None else {media: schema}, headers or {}, links or {})


@dataclass(frozen=True)
class Operation:
    """One operation: a route's method. Errors are answered by the error edge (web/errors.py: JSON, in OpenAI's shape
    on its endpoints); refusals by the view's own page (HTML), with the same status and headers. Either is a class,
    whose status, type and description web/errors.py gives, or (class, what raises it on this route)."""

    id: str
    summary: str
    tag: str
    description: Text = ""
    method: str | None = None  # the method it describes, for a view that serves several
    params: Sequence[dict[str, Any]] = ()  # query and header parameters (path ones come from the rule)
    body: Schema = None
    body_media: str = JSON
    answers: dict[int, Reply] = field(default_factory=dict)
    errors: Sequence[Fault] = ()
    refusals: Sequence[Fault] = ()
    public: bool = False  # no authentication, even with API keys configured


def documented(operation_id: str, summary: str, tag: str, **declared: Any) -> Callable[[View], View]:
    """Declare the operation a view serves (placed under its route's decorator; twice for a view of two methods)."""
    operation = Operation(operation_id, summary, tag, **declared)

    def declare(view: View) -> View:
        setattr(view, ATTRIBUTE, [*operations_of(view), operation])
        return view

    return declare


def operations_of(view: Callable[..., Any]) -> list[Operation]:
    """What `view` declared (none: an undocumented route)."""
    return list(getattr(view, ATTRIBUTE, []))
