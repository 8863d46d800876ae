"""JSON API under /v1: submit, poll, cancel, list."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request, url_for
from werkzeug.exceptions import RequestEntityTooLarge

from tasks.errors import (
    ContextLengthExceeded,
    Forbidden,
    InvalidJSON,
    InvalidParameter,
    InvalidRequest,
    JobAlreadyEnded,
    JobNotFound,
    ModelNotFound,
    ModelUnavailable,
    PromptTooLarge,
    QueueFull,
    QuotaExceeded,
    Unauthorized,
    Unavailable,
)
from tasks.job import Job
from web import responses
from web.admission import admit
from web.apidoc import documented, reply
from web.auth import current_owner
from web.limits import CANCEL_WAIT_S, LIMIT, LIST_LIMIT_MAX, list_limit
from web.schemas import SubmitJob, json_body, parse, to_spec
from web.services import services

bp = Blueprint("api", __name__)

#: Where a submitted job's answer leads: polling it, cancelling it.
LINKS = {
    "GetJob": {"operationId": "getJob", "parameters": {"job_id": "$response.body#/id"}},
    "CancelJob": {"operationId": "cancelJob", "parameters": {"job_id": "$response.body#/id"}},
}


def job_response(job: Job, status: int = 200) -> Response:
    response = jsonify(responses.Job.of(job))
    response.status_code = status
    return response


@bp.post("/v1/jobs")
@documented(
    "submitJob",
    "Submit a job",
    "jobs",
    description="Admit a job into the fair queue. It then runs when its turn comes; poll it, follow its events, or "
    "cancel it. With `response_format` (`json_object`, or `json_schema` and its schema, as chat completions take it), "
    "each token is drawn under the schema's grammar: the output is JSON of it, as text.",
    body=SubmitJob,
    answers={202: reply("admitted: the job, queued", responses.Job, headers={"Location": True}, links=LINKS)},
    errors=[
        InvalidJSON,
        Unauthorized,
        Forbidden,
        ModelNotFound,
        (PromptTooLarge, lambda s: f"over {s.max_prompt_chars} characters"),
        ContextLengthExceeded,
        RequestEntityTooLarge,
        (
            InvalidRequest,
            "wrong types, values out of range, unknown fields, neither or both of prompt/messages, an empty prompt, "
            "`max_tokens` or `ttl_s` over this server's limit, a `response_format` schema that cannot be enforced "
            "(why, and `param` names it)",
        ),
        QuotaExceeded,
        QueueFull,
        ModelUnavailable,
        Unavailable,
    ],
)
def submit() -> Response:
    owner = current_owner()  # who is asking (and may they), before what they ask
    req = parse(SubmitJob, json_body(request))
    job = admit(*to_spec(req, owner, services().settings))
    response = job_response(job, 202)
    response.headers["Location"] = url_for("api.get_job", job_id=job.id)
    return response


@bp.get("/v1/jobs/<job_id>")
@documented(
    "getJob",
    "Get a job",
    "jobs",
    description="The job now. Polling a watched job counts as watching it.",
    answers={200: reply("the job", responses.Job)},
    errors=[Unauthorized, JobNotFound, Unavailable],
)
def get_job(job_id: str) -> Response:
    """The job now; polling a watched job counts as watching it."""
    store = services().store
    job = store.get(job_id, current_owner())
    store.keep_watching(job)
    return job_response(job)


@bp.delete("/v1/jobs/<job_id>")
@documented(
    "cancelJob",
    "Cancel a job",
    "jobs",
    description="A queued job ends `cancelled` at once and never runs; a running one stops within one decode step, "
    "keeping its partial output. Again on a cancelled job: 200.",
    answers={200: reply("the job, cancelled", responses.Job)},
    errors=[Unauthorized, Forbidden, JobNotFound, JobAlreadyEnded, Unavailable],
)
def cancel_job(job_id: str) -> Response:
    """Cancel a waiting job at once; for a running one, wait briefly for the worker to stop it."""
    return job_response(services().store.cancel(job_id, current_owner(), wait_s=CANCEL_WAIT_S))


@bp.get("/v1/jobs")
@documented(
    "listJobs",
    "List the caller's recent jobs",
    "jobs",
    params=[LIMIT],
    answers={200: reply("the jobs", responses.JobList)},
    errors=[
        (InvalidParameter, f"`limit` is not one whole number from 1 to {LIST_LIMIT_MAX}; it is never clamped"),
        Unauthorized,
        Unavailable,
    ],
)
def list_jobs() -> Response:
    jobs = services().store.list(current_owner(), list_limit())
    return jsonify({"object": "list", "data": [responses.Job.of(job) for job in jobs]})
