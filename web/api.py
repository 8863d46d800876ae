"""JSON API under /v1: submit, poll, cancel, list."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request, url_for

from tasks.job import Job
from web import responses
from web.admission import admit
from web.auth import current_owner
from web.limits import CANCEL_WAIT_S, list_limit
from web.schemas import SubmitJob, json_body, parse, to_spec
from web.services import services

bp = Blueprint("api", __name__)


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
