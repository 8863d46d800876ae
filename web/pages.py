"""Server-rendered pages: a form to submit a job, a live page per job, and the visitor's list of jobs."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import redis
from flask import Response, redirect, render_template, request, url_for
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.wrappers import Response as BaseResponse  # what redirect() returns (flask's Response is one)

from tasks.errors import (
    Forbidden,
    InvalidRequest,
    JobNotFound,
    ModelNotFound,
    ModelUnavailable,
    OnelaneError,
    PromptTooLarge,
    QueueFull,
    QuotaExceeded,
    Unauthorized,
    Unavailable,
)
from tasks.job import Job
from web import body, conversation, responses
from web.admission import admit
from web.apidoc import FORM, JSON, MULTIPART, Reply, documented, reply
from web.auth import check_csrf, csrf_token, current_owner, sign_in, signed_in, start_visit
from web.errors import error_headers, status_for
from web.forms import PRIORITIES, form, form_defaults, submission, submit_form
from web.health import model_unready
from web.html import SIGN_IN, excerpt, pages_blueprint, webpage
from web.schemas import SubmitJob, parse, to_spec
from web.services import services

bp = pages_blueprint("pages", __name__)


#: What refuses a job the form asked for: the form comes back, filled in, with the message and the API's status.
REFUSED = [ModelNotFound, QuotaExceeded, QueueFull, ModelUnavailable]


@bp.before_request
def _visit() -> BaseResponse | None:
    # A browser gets its own identity before anything is looked up; a POST must already have one (and its CSRF token).
    if request.method in ("GET", "HEAD"):
        start_visit()
    if services().settings.keys_required and not signed_in() and request.endpoint != "pages.login":
        return redirect(url_for("pages.login"), code=303)
    return None


@bp.context_processor
def _template_globals() -> dict[str, Any]:
    return {"csrf_token": csrf_token}


@bp.app_template_filter("iso_time")
def iso_time(epoch_s: float) -> str:
    """Seconds since the epoch as ISO 8601 in UTC."""
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="seconds")


@bp.app_template_filter("utc_time")
def utc_time(epoch_s: float) -> str:
    """Seconds since the epoch as a readable UTC time (the page's script shows it in local time)."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def render_form(values: dict[str, str], error: OnelaneError | None = None) -> Response:
    """The submit form, filled with `values`, with the error that refused them (and its API status), if any."""
    html = render_template(
        "index.html",
        values=values,
        error=error,
        settings=services().settings,
        priorities=PRIORITIES,
        notice=model_notice(),
    )
    response = Response(html)
    if error is not None:
        response.status_code = status_for(error)
        response.headers.update(error_headers(error))
    return response


def model_notice() -> str | None:
    """Why the default model cannot take a job at once (it loads, or cannot load), for the form; None if it can, or
    if Redis cannot tell (a job's submission says so)."""
    svc = services()
    try:
        return model_unready(svc.store.readings.snapshot(), svc.settings.model_name)
    except redis.RedisError:
        return None


@bp.route("/login", methods=["GET", "POST"])
@documented(
    "loginPage",
    "Sign in with an API key",
    "pages",
    method="get",
    public=True,
    answers={200: webpage("the sign-in form")},
)
@documented(
    "login",
    "Sign this browser in",
    "pages",
    method="post",
    public=True,
    description="Binds the browser's session to the user owning the key; the key itself is not kept.",
    body=form({"key": {"type": "string"}}, ["key"]),
    body_media=FORM,
    answers={
        303: Reply("signed in: to the form", headers={"Location": "/"}),
        400: webpage("the form expired (a missing or wrong CSRF token, or another site's request)"),
        401: webpage("not a valid API key (in local mode, no key is)"),
        413: webpage("the key is too long"),
    },
)
def login() -> BaseResponse | tuple[str, int]:
    """With API keys configured, a browser signs in once with its key."""
    if request.method == "GET":
        return render_template("login.html", error=None), 200
    try:
        check_csrf()
    except Forbidden:
        return render_template("login.html", error="The form expired; please try again."), 400
    except RequestEntityTooLarge:
        return render_template("login.html", error="That API key is too long."), 413
    if sign_in(body.form(request).get("key", "")) is None:
        return render_template("login.html", error="That API key is not valid."), 401
    return redirect(url_for("pages.index"), code=303)


@bp.get("/")
@documented("formPage", "The form to submit a job", "pages", answers={200: webpage("the form"), 303: SIGN_IN})
def index() -> Response:
    return render_form(form_defaults())


@bp.post("/jobs")
@documented(
    "submitForm",
    "Submit the form's job",
    "pages",
    description="The job is watched by its page: closed before the job starts, it is cancelled. Refused, the form "
    "comes back filled in, with the message and the status the API would answer.",
    body=submit_form,
    body_media=MULTIPART,
    answers={
        303: Reply(
            "admitted: to the job's page, or (API keys, not signed in) to /login",
            headers={"Location": "the job's page, or /login"},
        )
    },
    refusals=[
        Unauthorized,
        Forbidden,
        (PromptTooLarge, lambda s: f"over {s.max_prompt_chars} characters, or the body too large"),
        (InvalidRequest, "a field is out of range, or the prompt is empty"),
        *REFUSED,
    ],
    errors=[Unavailable],
)
def submit() -> BaseResponse:
    """Admit the form's job as watched (skipped if its page is closed before it starts), then show its page."""
    svc = services()
    try:
        form = body.form(request)
    except RequestEntityTooLarge:
        limit = svc.settings.max_prompt_chars
        return render_form(form_defaults(), PromptTooLarge(f"the prompt is too large; the limit is {limit} characters"))
    values = {**form_defaults(), **form.to_dict()}
    try:
        owner = current_owner()  # and its CSRF token, before anything else is looked at
        req = parse(SubmitJob, submission(form, request.files))
        job = admit(*to_spec(req, owner, svc.settings, watched=True))
    except OnelaneError as exc:
        return render_form(values, exc)
    return redirect(url_for("pages.job_page", job_id=job.id), code=303)


@bp.get("/jobs/<job_id>")
@documented(
    "jobPage",
    "A job's live page",
    "pages",
    description="Opening it counts as watching the job.",
    answers={200: webpage("the job's page"), 303: SIGN_IN},
    errors=[Unauthorized, Unavailable],
    refusals=[JobNotFound],
)
def job_page(job_id: str) -> Response | tuple[str, int]:
    """The job, live: opening its page counts as watching it."""
    store = services().store
    try:
        job = store.get(job_id, current_owner())
    except JobNotFound:
        return render_template("not_found.html", job_id=job_id), 404
    store.keep_watching(job)
    return render_job(job)


@bp.get("/jobs/<job_id>/images/<digest>")
@documented(
    "jobImage",
    "An image of a job's conversation",
    "pages",
    description="The bytes of an image the job's messages hold, while the server keeps them (as long as the job may "
    "wait and run); the job's page shows it in its turn.",
    answers={200: Reply("the image", {"image/*": {"type": "string", "format": "binary"}}), 303: SIGN_IN},
    errors=[Unauthorized, Unavailable],
    refusals=[JobNotFound],
)
def job_image(job_id: str, digest: str) -> Response | tuple[str, int]:
    store = services().store
    try:
        job = store.get(job_id, current_owner())
    except JobNotFound:
        return render_template("not_found.html", job_id=job_id), 404
    picture = next((p for m in job.spec.messages or () for p in m.images if p.digest == digest), None)
    data = store.image(digest) if picture is not None else None
    if picture is None or data is None:
        return render_template("not_found.html", job_id=job_id), 404
    answer = Response(data, mimetype=picture.mime or "application/octet-stream")
    answer.headers.update({"Cache-Control": "private, max-age=3600", "X-Content-Type-Options": "nosniff"})
    return answer


def render_job(job: Job, error: OnelaneError | None = None, text: str = "") -> Response:
    """The job's page: a chat as its thread (each earlier answer with the job that gave it), and, once it completed,
    the form that continues it, filled with `text` and the error that refused it, if any."""
    turns = conversation.thread(job, services().store.list(job.owner)) if job.spec.messages is not None else []
    html = render_template(
        "job.html",
        job=job,
        body=responses.Job.of(job),
        turns=turns,
        continuable=conversation.continuable(job),
        error=error,
        text=text,
    )
    response = Response(html, status=status_for(error) if error else 200)
    if error is not None:
        response.headers.update(error_headers(error))
    return response


CONTINUE_REFUSED = [
    JobNotFound,
    (PromptTooLarge, "the conversation is too large"),
    (InvalidRequest, "the job is not a completed chat, or the message is empty"),
    *REFUSED,
]


@bp.post("/jobs/<job_id>/continue")
@documented(
    "continueJob",
    "Continue a completed chat with a follow-up turn",
    "pages",
    description="A new watched job with the job's model and options, whose messages are the job's, its answer, then "
    "`prompt` as the user's: the history the worker's prefix cache holds. A form is sent to the new job's page; the "
    "page's script (Accept: application/json) gets the new job and its URLs, and a refusal as JSON.",
    body=lambda s: form({"prompt": {"type": "string", "maxLength": s.max_prompt_chars}}, ["prompt"]),
    body_media=FORM,
    answers={
        202: reply(
            "to the script: the new job, its page, events, cancel and continue URLs",
            {"type": "object"},
            JSON,
            headers={"Location": "the new job's page"},
        ),
        303: Reply("admitted: to the new job's page", headers={"Location": "the new job's page"}),
    },
    errors=[Unauthorized, Forbidden, *CONTINUE_REFUSED, Unavailable],
    refusals=CONTINUE_REFUSED,
)
def continue_job(job_id: str) -> BaseResponse:
    """Continue a completed chat with the user's next message: a new, watched job carrying the whole history. A form
    is sent to the new job's page; the page's script (asking for JSON) gets the new job, to follow it in place."""
    svc = services()
    owner = current_owner()  # and its CSRF token, before anything else is looked at
    job = svc.store.get(job_id, owner)  # JobNotFound -> 404
    text = ""
    try:
        text = body.form(request).get("prompt", "")
        new = admit(*conversation.follow_up(job, text, svc.settings))
    except RequestEntityTooLarge:
        limit = svc.settings.max_prompt_chars
        return _refused(job, PromptTooLarge(f"the conversation is too large; the limit is {limit} characters"), "")
    except OnelaneError as exc:
        return _refused(job, exc, text)
    url = url_for("pages.job_page", job_id=new.id)
    if not _asks_json():
        return redirect(url, code=303)
    answer = {
        "job": responses.Job.of(new),
        "url": url,
        "events_url": url_for("stream.job_events", job_id=new.id),
        "cancel_url": url_for("api.cancel_job", job_id=new.id),
        "continue_url": url_for("pages.continue_job", job_id=new.id),
    }
    return Response(json.dumps(answer), status=202, mimetype="application/json", headers={"Location": url})


def _refused(job: Job, error: OnelaneError, text: str) -> Response:
    """A refused follow-up: the job's page again with the error and the text kept; the script gets the JSON error."""
    if _asks_json():
        raise error
    return render_job(job, error, text)


def _asks_json() -> bool:
    """The page's script, which asks for JSON; a form (whatever its Accept says, or none) is answered with pages."""
    return request.accept_mimetypes.best_match(("text/html", "application/json")) == "application/json"


@bp.get("/jobs")
@documented(
    "jobsPage",
    "The visitor's recent jobs",
    "pages",
    answers={200: webpage("the list"), 303: SIGN_IN},
    errors=[Unauthorized, Unavailable],
)
def job_list() -> tuple[str, int]:
    jobs = services().store.list(current_owner())
    return render_template("jobs.html", jobs=jobs, excerpt=excerpt), 200
