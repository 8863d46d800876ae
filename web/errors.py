"""The one edge where errors become HTTP: JSON bodies, the right status, never a stack trace; a browser's navigation
(Accept preferring text/html) gets the same error as a page of the site instead.

What an error class means to a client (its status, type, headers and description) is told here once, for the
handlers and for /openapi.json alike (web/openapi.py documents each route's errors from their classes).
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable
from typing import Any

import redis
from flask import Flask, Response, jsonify, render_template, request
from werkzeug.exceptions import HTTPException
from werkzeug.http import HTTP_STATUS_CODES

from tasks import errors
from tasks.job import Job, JobStatus
from web.html import SECURITY_HEADERS

logger = logging.getLogger(__name__)

STATUS: dict[type[errors.OnelaneError], int] = {
    errors.InvalidJSON: 400,
    errors.InvalidParameter: 400,
    errors.ContextLengthExceeded: 400,
    errors.PromptTooLarge: 413,
    errors.InvalidRequest: 422,
    errors.NotFound: 404,
    errors.JobAlreadyEnded: 409,
    errors.JobCancelled: 410,
    errors.JobExpired: 503,
    errors.JobFailed: 500,
    errors.ModelNotFound: 404,
    errors.QuotaExceeded: 429,
    errors.QueueFull: 503,
    errors.ModelUnavailable: 503,  # the model failed to load: not the caller's doing, unlike a quota
    errors.Unauthorized: 401,
    errors.Forbidden: 403,
    errors.Unavailable: 503,
    errors.CheckerBusy: 503,
    errors.StorageFull: 503,
    errors.ImageReaderBusy: 503,
}


#: The headers an error's answer carries, on a page as in the API: when to retry, how to authenticate.
HEADERS: dict[type[errors.OnelaneError], tuple[str, Callable[[Any], str]]] = {
    errors.Overloaded: ("Retry-After", lambda exc: str(exc.retry_after_s)),
    errors.Unauthorized: ("WWW-Authenticate", lambda exc: 'Bearer realm="onelane"'),
}

REDIS_RETRY_AFTER_S = 5  # what a client is told to wait while Redis is unreachable
OPENAI_BLUEPRINTS = ("openai", "pooling", "responses", "files", "batches")  # whose errors take OpenAI's shape
OPENAI_CATEGORY = {401: "authentication_error", 429: "rate_limit_error"}
ANTHROPIC_BLUEPRINTS = ("anthropic",)  # whose errors take Anthropic's shape
#: Anthropic's error types by status; a 503 (the queue is full, the model unavailable) is its 529 `overloaded_error`
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


class ClientGone(Exception):
    """The client hung up: nobody reads an answer (its job was cancelled). Answered 499, to no one."""


def error_body(type_: str, message: str, param: str | None = None) -> dict[str, object]:
    """onelane's error body, `{"error": {"type", "message", "param"}}` (`param` only when one is named)."""
    return {"error": {"type": type_, "message": message, **({"param": param} if param is not None else {})}}


def wants_html() -> bool:
    """A browser's navigation: its Accept prefers text/html to JSON. curl's `*/*`, the SDKs, fetch() and no Accept at
    all tie or prefer JSON, and keep getting JSON."""
    return request.accept_mimetypes.best_match(("application/json", "text/html")) == "text/html"


def error_page(status: int, type_: str, message: str) -> Response:
    """The error as a page with the site's nav: the same status and message as the JSON, nothing more."""
    title = "Page not found" if status == 404 else HTTP_STATUS_CODES.get(status, "Error")
    page = render_template("error.html", status=status, type=type_, title=title, message=message)
    response = Response(page, status=status, mimetype="text/html")
    response.headers.update({**SECURITY_HEADERS, "Cache-Control": "no-store"})
    return response


def error_response(status: int, type_: str, message: str, param: str | None = None) -> Response:
    """onelane's error body; on the OpenAI endpoints, OpenAI's shape (and 400 for any invalid request); a page for a
    browser's navigation. Either way it varies with Accept, so no cache serves one to the other."""
    response = _html_or_none(status, type_, message) if wants_html() else None
    if response is None:
        response = _error_json(status, type_, message, param)
    response.vary.add("Accept")
    return response


def _html_or_none(status: int, type_: str, message: str) -> Response | None:
    try:
        return error_page(status, type_, message)
    except Exception:  # an error page that cannot render (say, Redis down under the nav): the JSON still answers
        logger.exception("the error page did not render")
        return None


def _error_json(status: int, type_: str, message: str, param: str | None = None) -> Response:
    if request.blueprint in ANTHROPIC_BLUEPRINTS:
        status = shown_status(status, request.blueprint)
        response = jsonify(anthropic_error(status, message))
    elif openai_shaped(request.blueprint):
        status = shown_status(status, request.blueprint)
        response = jsonify(
            {"error": {"message": message, "type": openai_category(status), "param": param, "code": type_}}
        )
    else:
        response = jsonify(error_body(type_, message, param))
    response.status_code = status
    return response


def openai_error(exc: errors.OnelaneError) -> dict[str, object]:
    """The error object inside an OpenAI stream's `data: {"error": ...}` line (and a batch's error line)."""
    category = "invalid_request_error" if isinstance(exc, errors.InvalidRequest) else "server_error"
    return {"message": exc.message, "type": category, "param": exc.param, "code": exc.type}


def job_error(job: Job, model_retry_s: float) -> errors.OnelaneError:
    """What a caller waiting for `job`'s answer is told when it ended otherwise. A job its worker failed as an invalid
    request is the request's fault, as if refused at admission: only the worker knows the model's vocabulary, so a
    `logit_bias` naming a token beyond it is found there (the job's error names the field). A job failed because its
    model could not load is told so as admission tells the jobs after it: 503, naming the model, with when it is
    tried again (ONELANE_MODEL_RETRY_S), not a 500: nothing went wrong with the server's own work."""
    if job.status is JobStatus.FAILED and job.error is not None and job.error.type == errors.ModelUnavailable.type:
        why = f"the model {job.spec.model!r} is unavailable: {job.error.message}"
        return errors.ModelUnavailable(why, retry_after_s=max(1, math.ceil(model_retry_s)))
    if job.status is JobStatus.FAILED and job.error is not None and job.error.type == errors.InvalidRequest.type:
        return errors.InvalidRequest(job.error.message, param=job.error.param)
    if job.status is JobStatus.FAILED and job.error is not None and job.error.type == errors.ContextLengthExceeded.type:
        return errors.ContextLengthExceeded.of(job.error.message, param=job.error.param)
    return errors.JobDidNotComplete.of(job)


def anthropic_error(status: int, message: str) -> dict[str, object]:
    """Anthropic's error body (and a stream's `error` event's data) for an error answered with `status`."""
    return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}


def shown_message(exc: errors.OnelaneError, blueprint: str | None) -> str:
    """An error's message on this blueprint's routes: Anthropic's words for a prompt too long on Anthropic's."""
    if isinstance(exc, errors.ContextLengthExceeded) and blueprint in ANTHROPIC_BLUEPRINTS:
        return exc.anthropic
    return exc.message


def openai_shaped(blueprint: str | None) -> bool:
    """Errors on this blueprint's routes take OpenAI's shape."""
    return blueprint in OPENAI_BLUEPRINTS


def shown_status(status: int, blueprint: str | None) -> int:
    """The status an error is answered with on this blueprint's routes: OpenAI's and Anthropic's endpoints answer any
    invalid request 400; Anthropic's an overload (503) 529."""
    anthropic = blueprint in ANTHROPIC_BLUEPRINTS
    if status == 422 and (anthropic or openai_shaped(blueprint)):
        return 400
    return 529 if status == 503 and anthropic else status


def openai_category(status: int) -> str:
    """OpenAI's error `type` for an error answered with `status`."""
    return OPENAI_CATEGORY.get(status, "server_error" if status >= 500 else "invalid_request_error")


def status_of(kind: type[Exception]) -> int:
    """The HTTP status of an error class: an onelane error's is the first, most specific match in STATUS; an HTTP
    exception's (werkzeug's: a body too large) its code."""
    if issubclass(kind, HTTPException):
        return kind.code or 500
    return next((code for cls, code in STATUS.items() if issubclass(kind, cls)), 500)


def status_for(exc: errors.OnelaneError) -> int:
    """The HTTP status of an onelane error."""
    return status_of(type(exc))


def type_of(kind: type[Exception]) -> str:
    """The machine-readable type an error class is answered with (OpenAI's `code`)."""
    if issubclass(kind, HTTPException):
        code = kind.code or 500  # (`name` is a property of an instance: of the class, it is the property itself)
        return http_type(code, HTTP_STATUS_CODES.get(code))
    return kind.type if issubclass(kind, errors.OnelaneError) else "internal_error"


def http_type(status: int, name: str | None) -> str:
    """An HTTP exception's type: its name in snake case ("Not Found" -> not_found), payload_too_large for a 413."""
    return "payload_too_large" if status == 413 else (name or "error").lower().replace(" ", "_")


def meaning(kind: type[Exception]) -> str:
    """What an error class means, in a sentence: the first paragraph of its docstring (an HTTP exception's
    description, which its answer's message is)."""
    if issubclass(kind, HTTPException):
        return str(kind.description)
    return " ".join((inspect.getdoc(kind) or kind.__name__).split("\n\n")[0].split())


def header_names(kind: type[Exception]) -> list[str]:
    """The headers every error of this class is answered with."""
    return [name for cls, (name, _) in HEADERS.items() if issubclass(kind, cls)]


def error_headers(exc: errors.OnelaneError) -> dict[str, str]:
    """The headers an error's answer carries (HEADERS)."""
    return {name: value(exc) for cls, (name, value) in HEADERS.items() if isinstance(exc, cls)}


def register(app: Flask) -> None:
    @app.errorhandler(errors.OnelaneError)
    def onelane_error(exc: errors.OnelaneError) -> Response:
        response = error_response(status_for(exc), exc.type, shown_message(exc, request.blueprint), exc.param)
        response.headers.update(error_headers(exc))
        return response

    @app.errorhandler(ClientGone)
    def client_gone(_: ClientGone) -> Response:  # nobody reads an answer: its job was cancelled
        return Response(status=499)

    @app.errorhandler(redis.exceptions.ConnectionError)
    @app.errorhandler(redis.exceptions.TimeoutError)
    def redis_down(exc: Exception) -> Response:
        logger.warning("redis unreachable: %s", exc)
        return onelane_error(
            errors.Unavailable("the job store is unreachable; try again shortly", retry_after_s=REDIS_RETRY_AFTER_S)
        )

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        return error_response(status, http_type(status, exc.name), exc.description or exc.name)

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> Response:
        logger.exception("unhandled error")
        return error_response(500, "internal_error", "internal error; it has been logged")
