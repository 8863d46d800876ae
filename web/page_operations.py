"""What the routes for a browser promise, as OpenAPI operations: the pages, the queue dashboard, and the document
itself (/openapi.json, /docs). web/operations.py describes the API's routes; web/openapi.py joins both.

A page answers HTML; what goes wrong before a page can say it (an unknown key, Redis unreachable) is JSON, as in
the API, or, to a browser's navigation (Accept preferring text/html), the same error as a page of the site. With API keys configured, a browser that has not signed in is sent to /login (303).
"""

from __future__ import annotations

from typing import Any, get_args

from tasks.job import JobStatus, Priority
from tasks.settings import Settings
from web import responses
from web.operations import HEADERS, JOB_ID, JSON, Ref

HTML, FORM = "text/html", "application/x-www-form-urlencoded"
PAGE = {"type": "string"}
TAGS = [
    {
        "name": "pages",
        "description": "HTML pages for a browser: its session cookie says who it is, and every "
        "form it posts carries the session's CSRF token",
    },
    {"name": "dashboard", "description": "The queue dashboard: another user's jobs are only ever counted"},
    {"name": "docs", "description": "This document, as JSON and as a page"},
]


def _answer(
    description: str, media: dict[str, Any], headers: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A response: its description, its body's schema by media type, and its headers."""
    answer: dict[str, Any] = {"description": description, "content": {kind: {"schema": s} for kind, s in media.items()}}
    if headers:
        answer["headers"] = headers
    return answer


def _header(name: str, always: bool, description: str | None = None) -> dict[str, dict[str, Any]]:
    return {name: {**HEADERS[name], "required": always, **({"description": description} if description else {})}}


def page_operations(ref: Ref, s: Settings) -> list[tuple[str, str, dict[str, Any]]]:
    """(Flask endpoint, method, operation) for every route of a browser's."""
    error = ref(responses.Error)
    html, as_json = {HTML: PAGE}, {JSON: error}
    either = {HTML: PAGE, JSON: error}  # the page with its message, or the JSON error of the edge
    retry = _header("Retry-After", False)
    sign_in = (
        "303",
        {
            "description": "with API keys configured, a browser that has not signed in: to /login",
            "headers": _header("Location", True, "/login"),
        },
    )
    unauthorized = (
        "401",
        _answer(
            "unauthorized: an `Authorization` header that is not `Bearer <key>`, or a wrong key",
            as_json,
            _header("WWW-Authenticate", True),
        ),
    )
    forbidden = ("403", _answer("forbidden: a request another site made, or a missing CSRF token", as_json))
    too_large = ("413", _answer("payload_too_large: the body is larger than the server reads", as_json))
    unavailable = ("503", _answer("unavailable: Redis is unreachable", as_json, _header("Retry-After", True)))
    form = {"csrf_token": {"type": "string", "description": "the session's CSRF token, from the page's form"}}

    def refused(why: str, headers: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        """The form again, filled in, with the message and the status the API would answer."""
        return _answer(f"the form again: {why}", html, headers)

    def body(fields: dict[str, Any], required: list[str]) -> dict[str, Any]:
        schema = {"type": "object", "properties": {**form, **fields}, "required": ["csrf_token", *required]}
        return {"required": True, "content": {FORM: {"schema": schema}}}

    return [
        (
            "pages.index",
            "get",
            {
                "operationId": "formPage",
                "tags": ["pages"],
                "summary": "The form to submit a job",
                "responses": {"200": _answer("the form", html), **dict([sign_in])},
            },
        ),
        (
            "pages.submit",
            "post",
            {
                "operationId": "submitForm",
                "tags": ["pages"],
                "summary": "Submit the form's job",
                "description": "The job is watched by its page: closed before the job starts, it is cancelled. Refused, "
                "the form comes back filled in, with the message and the status the API would answer.",
                "requestBody": body(
                    {
                        "prompt": {"type": "string", "maxLength": s.max_prompt_chars},
                        "max_tokens": {
                            "type": "string",
                            "description": "a whole number, up to the server's limit; empty: its default",
                        },
                        "temperature": {"type": "string", "description": "a number from 0 to 2; empty: 0"},
                        "model": {"enum": [m.name for m in s.catalog]},
                        "priority": {"enum": list(get_args(Priority))},
                        "ignore_eos": {"type": "string", "description": "present (any value): generate to max_tokens"},
                    },
                    ["prompt"],
                ),
                "responses": {
                    "303": {
                        "description": "admitted: to the job's page, or (API keys, not signed in) to /login",
                        "headers": _header("Location", True, "the job's page, or /login"),
                    },
                    "401": refused(
                        "an `Authorization` header that is not `Bearer <key>`, or a wrong key",
                        _header("WWW-Authenticate", True),
                    ),
                    "403": refused(
                        "a request another site made, a missing CSRF token, or `interactive` asked of a key "
                        "that submits batch work only"
                    ),
                    "404": refused("the model is not one of /v1/models"),
                    "413": refused(f"the prompt is over {s.max_prompt_chars} characters, or the body too large"),
                    "422": refused("a field is out of range, or the prompt is empty"),
                    "429": refused(
                        "the caller already has as many waiting jobs as its quota allows", _header("Retry-After", True)
                    ),
                    "503": _answer(
                        "the queue is full or the model failed to load (the form again), or Redis is "
                        "unreachable (JSON)",
                        either,
                        retry,
                    ),
                },
            },
        ),
        (
            "pages.job_page",
            "get",
            {
                "operationId": "jobPage",
                "tags": ["pages"],
                "summary": "A job's live page",
                "description": "Opening it counts as watching the job.",
                "parameters": [JOB_ID],
                "responses": {
                    "200": _answer("the job's page", html),
                    **dict([sign_in, unauthorized]),
                    "404": _answer("no such job, or another user's", html),
                    **dict([unavailable]),
                },
            },
        ),
        (
            "pages.continue_job",
            "post",
            {
                "operationId": "continueJob",
                "tags": ["pages"],
                "summary": "Continue a completed chat with a follow-up turn",
                "description": "A new watched job with the job's model and options, whose messages are the job's, its "
                "answer, then `prompt` as the user's: the history the worker's prefix cache holds. A form is sent to "
                "the new job's page; the page's script (Accept: application/json) gets the new job and its URLs.",
                "parameters": [JOB_ID],
                "requestBody": body({"prompt": {"type": "string", "maxLength": s.max_prompt_chars}}, ["prompt"]),
                "responses": {
                    "202": _answer(
                        "to the script: the new job, its page, events, cancel and continue URLs",
                        {JSON: {"type": "object"}},
                        _header("Location", True, "the new job's page"),
                    ),
                    "303": {
                        "description": "admitted: to the new job's page",
                        "headers": _header("Location", True, "the new job's page"),
                    },
                    **dict([unauthorized, forbidden]),
                    "404": _answer("no such job, or another user's", either),
                    "413": _answer("the conversation is too large", either),
                    "422": _answer(
                        "the job is not a completed chat, or the message is empty (the page again, with the message)",
                        either,
                    ),
                    "429": _answer("the caller's quota is full", either, _header("Retry-After", True)),
                    "503": _answer("the queue is full, or Redis is unreachable", either, retry),
                },
            },
        ),
        (
            "pages.job_list",
            "get",
            {
                "operationId": "jobsPage",
                "tags": ["pages"],
                "summary": "The visitor's recent jobs",
                "responses": {"200": _answer("the list", html), **dict([sign_in, unauthorized, unavailable])},
            },
        ),
        (
            "pages.login",
            "get",
            {
                "operationId": "loginPage",
                "tags": ["pages"],
                "summary": "Sign in with an API key",
                "security": [],
                "responses": {"200": _answer("the sign-in form", html)},
            },
        ),
        (
            "pages.login",
            "post",
            {
                "operationId": "login",
                "tags": ["pages"],
                "summary": "Sign this browser in",
                "security": [],
                "description": "Binds the browser's session to the user owning the key; the key itself is not kept.",
                "requestBody": body({"key": {"type": "string"}}, ["key"]),
                "responses": {
                    "303": {"description": "signed in: to the form", "headers": _header("Location", True, "/")},
                    "400": _answer("the form expired (a missing or wrong CSRF token, or another site's request)", html),
                    "401": _answer("not a valid API key (in local mode, no key is)", html),
                    "413": _answer("the key is too long", html),
                },
            },
        ),
        (
            "dashboard.page",
            "get",
            {
                "operationId": "queuePage",
                "tags": ["dashboard"],
                "summary": "The queue dashboard",
                "description": "The running batch, who waits, the batches, the workers, recent failures and the last hour; it "
                "refreshes itself from /queue.json.",
                "responses": {"200": _answer("the dashboard", html), **dict([sign_in, unauthorized, unavailable])},
            },
        ),
        (
            "dashboard.board_json",
            "get",
            {
                "operationId": "queueBoard",
                "tags": ["dashboard"],
                "summary": "The dashboard's data",
                "description": "The caller's own jobs named (an admin's: every job, with its owner); everyone else's "
                "only counted, never their name, id or prompt.",
                "responses": {"200": _answer("the board", {JSON: _board()}), **dict([unauthorized, unavailable])},
            },
        ),
        (
            "dashboard.cancel",
            "post",
            {
                "operationId": "queueCancel",
                "tags": ["dashboard"],
                "summary": "Cancel a job from the dashboard",
                "description": "The caller's own job, or, for an admin, anyone's (its owner is told who cancelled it). "
                "As DELETE /v1/jobs/{job_id}: again on a cancelled job, 200.",
                "parameters": [JOB_ID],
                "responses": {
                    "200": _answer("the job's id and status now", {JSON: _cancelled()}),
                    **dict([unauthorized, forbidden]),
                    "404": _answer("not_found: no such job, or another user's (for an admin: no such job)", as_json),
                    "409": _answer("job_ended: the job ended otherwise (completed, failed, expired)", as_json),
                    **dict([too_large, unavailable]),
                },
            },
        ),
        (
            "docs.openapi_json",
            "get",
            {
                "operationId": "openapi",
                "tags": ["docs"],
                "summary": "This document (OpenAPI 3.1)",
                "description": "With API keys configured, for users only, as /v1/models: it names the served models.",
                "responses": {"200": _answer("the document", {JSON: {"type": "object"}}), **dict([unauthorized])},
            },
        ),
        (
            "docs.docs",
            "get",
            {
                "operationId": "docsPage",
                "tags": ["docs"],
                "summary": "This document as a page",
                "description": "Rendered on the server: no script, nothing from another origin.",
                "responses": {"200": _answer("the page", html), **dict([sign_in, unauthorized])},
            },
        ),
    ]


def _cancelled() -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["id", "status"],
        "properties": {"id": {"type": "string"}, "status": {"enum": [s.value for s in JobStatus]}},
    }


def _board() -> dict[str, Any]:
    """The board's outline (web/dashboard.py's board_view builds it; its fields are for the dashboard's script)."""
    fields = {
        "now": {"type": "number"},
        "viewer": {"type": "object"},
        "running": {"type": "object"},
        "waiting": {"type": "object"},
        "workers": {"type": "array"},
        "models": {"type": "array"},
        "failures": {"type": "array"},
        "minutes": {"type": "array"},
        "prefix_cache": {"type": "object"},
        "batches": {"type": "object"},
        "local_api": {"type": ["object", "null"], "description": "local mode: the API user's jobs, counted"},
    }
    return {"type": "object", "properties": fields, "required": list(fields), "additionalProperties": False}
