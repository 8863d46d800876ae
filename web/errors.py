"""The one edge where errors become HTTP: JSON bodies, the right status, never a stack trace; a browser's navigation
(Accept preferring text/html) gets the same error as a page of the site instead."""

from __future__ import annotations

import logging

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
}


REDIS_RETRY_AFTER_S = 5  # what a client is told to wait while Redis is unreachable
OPENAI_BLUEPRINTS = ("openai", "responses", "files", "batches")  # whose errors take OpenAI's shape
OPENAI_CATEGORY = {401: "authentication_error", 429: "rate_limit_error"}


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
    if request.blueprint in OPENAI_BLUEPRINTS:
        status = 400 if status == 422 else status
        category = OPENAI_CATEGORY.get(status, "server_error" if status >= 500 else "invalid_request_error")
        response = jsonify({"error": {"message": message, "type": category, "param": param, "code": type_}})
    else:
        response = jsonify(error_body(type_, message, param))
    response.status_code = status
    return response


def openai_error(exc: errors.OnelaneError) -> dict[str, object]:
    """The error object inside an OpenAI stream's `data: {"error": ...}` line (and a batch's error line)."""
    category = "invalid_request_error" if isinstance(exc, errors.InvalidRequest) else "server_error"
    return {"message": exc.message, "type": category, "param": exc.param, "code": exc.type}


def job_error(job: Job) -> errors.OnelaneError:
    """What a caller waiting for `job`'s answer is told when it ended otherwise. A job its worker failed as an invalid
    request is the request's fault, as if refused at admission: only the worker knows the model's vocabulary, so a
    `logit_bias` naming a token beyond it is found there (the job's error names the field)."""
    if job.status is JobStatus.FAILED and job.error is not None and job.error.type == errors.InvalidRequest.type:
        return errors.InvalidRequest(job.error.message, param=job.error.param)
    return errors.JobDidNotComplete.of(job)


def status_for(exc: errors.OnelaneError) -> int:
    """The HTTP status of an onelane error (the first, most specific match in STATUS)."""
    return next((code for cls, code in STATUS.items() if isinstance(exc, cls)), 500)


def error_headers(exc: errors.OnelaneError) -> dict[str, str]:
    """The headers an error's answer carries, on a page as in the API: when to retry, how to authenticate."""
    if isinstance(exc, errors.Overloaded):
        return {"Retry-After": str(exc.retry_after_s)}
    if isinstance(exc, errors.Unauthorized):
        return {"WWW-Authenticate": 'Bearer realm="onelane"'}
    return {}


def register(app: Flask) -> None:
    @app.errorhandler(errors.OnelaneError)
    def onelane_error(exc: errors.OnelaneError) -> Response:
        response = error_response(status_for(exc), exc.type, exc.message, exc.param)
        response.headers.update(error_headers(exc))
        return response

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
        type_ = "payload_too_large" if status == 413 else (exc.name or "error").lower().replace(" ", "_")
        return error_response(status, type_, exc.description or exc.name)

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> Response:
        logger.exception("unhandled error")
        return error_response(500, "internal_error", "internal error; it has been logged")
