"""The queue dashboard (/queue): the running batch and its occupancy, who waits, the workers and their health, recent
failures, and the last hour's throughput and queue wait; the page refreshes itself from /queue.json. What each viewer
may see of it is web/board.py's.
"""

from __future__ import annotations

import logging

from flask import Response, jsonify, redirect, render_template, url_for
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.wrappers import Response as BaseResponse  # what redirect() returns (flask's Response is one)

from tasks.errors import Forbidden, JobAlreadyEnded, JobNotFound, Unauthorized, Unavailable
from tasks.job import JobStatus
from web.apidoc import documented, reply
from web.auth import csrf_token, signed_in, start_visit
from web.board import board_schema, board_view, viewer
from web.html import SIGN_IN, pages_blueprint, webpage
from web.limits import CANCEL_WAIT_S  # as DELETE /v1/jobs/<id>: wait briefly for a running job to stop
from web.services import services

logger = logging.getLogger(__name__)

# what a user may see is theirs alone, and it is live
bp = pages_blueprint("dashboard", __name__, {"Cache-Control": "no-store"})

POLL_MS = 2000  # how often the page asks for /queue.json
CANCELLED = {
    "type": "object",
    "additionalProperties": False,
    "required": ["id", "status"],
    "properties": {"id": {"type": "string"}, "status": {"enum": [s.value for s in JobStatus]}},
}


@bp.get("/queue")
@documented(
    "queuePage",
    "The queue dashboard",
    "dashboard",
    description="The running batch, who waits, the batches, the workers, recent failures and the last hour; it "
    "refreshes itself from /queue.json.",
    answers={200: webpage("the dashboard"), 303: SIGN_IN},
    errors=[Unauthorized, Unavailable],
)
def page() -> BaseResponse | str:
    start_visit()
    if services().settings.keys_required and not signed_in():
        return redirect(url_for("pages.login"), code=303)
    return render_template("queue.html", board=board_view(viewer()), poll_ms=POLL_MS, csrf_token=csrf_token)


@bp.get("/queue.json")
@documented(
    "queueBoard",
    "The dashboard's data",
    "dashboard",
    description="The caller's own jobs named (an admin's: every job, with its owner); everyone else's only counted, "
    "never their name, id or prompt.",
    answers={200: reply("the board", board_schema())},
    errors=[Unauthorized, Unavailable],
)
def board_json() -> Response:
    return jsonify(board_view(viewer()))


@bp.post("/queue/jobs/<job_id>/cancel")
@documented(
    "queueCancel",
    "Cancel a job from the dashboard",
    "dashboard",
    description="The caller's own job, or, for an admin, anyone's (its owner is told who cancelled it). As DELETE "
    "/v1/jobs/{job_id}: again on a cancelled job, 200.",
    answers={200: reply("the job's id and status now", CANCELLED)},
    errors=[
        Unauthorized,
        Forbidden,
        (JobNotFound, "for an admin: no such job"),
        JobAlreadyEnded,
        (RequestEntityTooLarge, "the body is larger than the server reads"),
        Unavailable,
    ],
)
def cancel(job_id: str) -> Response:
    """Cancel a job from the dashboard: one's own, or, for an admin, anyone's (its owner is told who)."""
    who, store = viewer(), services().store
    owner, why = who.name, None
    if who.admin:
        owner = store.get(job_id).owner  # JobNotFound -> 404
        if owner != who.name:
            why = ("cancelled_by_admin", f"an administrator ({who.name}) cancelled this job")
            logger.info("admin %s cancels job %s of %s", who.name, job_id, owner)
    job = store.cancel(job_id, owner, wait_s=CANCEL_WAIT_S, error=why)
    return jsonify({"id": job.id, "status": job.status.value})
