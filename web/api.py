"""JSON API under /v1: submit, poll, cancel, list."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request, url_for

from tasks.errors import InvalidParameter
from tasks.job import Job
from web import responses
from web.admission import admit
from web.auth import current_owner
from web.schemas import SubmitJob, json_body, parse, to_spec
from web.services import services

bp = Blueprint("api", __name__)

CANCEL_WAIT_S = 2.0
LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX = 50, 200  # GET /v1/jobs?limit=


def job_response(job: Job, status: int = 200) -> Response:
    response = jsonify(responses.Job.of(job))
    response.status_code = status
    return response


@bp.post("/v1/jobs")
def submit() -> Response:
    owner = current_owner()  # who is asking (and may they), before what they ask
    req = parse(SubmitJob, json_body(request))
    job = admit(*to_spec(req, owner, services().settings))
    response = job_response(job, 202)
    response.headers["Location"] = url_for("api.get_job", job_id=job.id)
    return response


@bp.get("/v1/jobs/<job_id>")
def get_job(job_id: str) -> Response:
    """The job now; polling a watched job counts as watching it."""
    store = services().store
    job = store.get(job_id, current_owner())
    store.keep_watching(job)
    return job_response(job)


@bp.delete("/v1/jobs/<job_id>")
def cancel_job(job_id: str) -> Response:
    """Cancel a waiting job at once; for a running one, wait briefly for the worker to stop it."""
    return job_response(services().store.cancel(job_id, current_owner(), wait_s=CANCEL_WAIT_S))


@bp.get("/v1/jobs")
def list_jobs() -> Response:
    jobs = services().store.list(current_owner(), list_limit())
    return jsonify({"object": "list", "data": [responses.Job.of(job) for job in jobs]})


def list_limit() -> int:
    """`?limit=`: how many jobs to list, LIST_LIMIT_DEFAULT when absent.

    Anything but one whole number from 1 to LIST_LIMIT_MAX, in plain digits, is refused (400 invalid_request, naming
    the range), never clamped or replaced by the default: a client asking for 1000 would otherwise not learn that
    it got 200. OpenAI's list endpoints refuse an out-of-range limit the same way.
    """
    given = request.args.getlist("limit")
    if not given:
        return LIST_LIMIT_DEFAULT
    digits = given[0].lstrip("0") or "0"  # leading zeros are harmless; too many digits are refused before int()
    short = digits.isascii() and digits.isdigit() and len(digits) <= len(str(LIST_LIMIT_MAX))
    if len(given) == 1 and short and 1 <= int(digits) <= LIST_LIMIT_MAX:
        return int(digits)
    raise InvalidParameter(f"limit must be given once, as a whole number from 1 to {LIST_LIMIT_MAX}", param="limit")
