"""Server-sent events for one job: position while it waits, then tokens, then exactly one terminal event.

Each event from the job's durable log carries its index as the SSE `id`, so a client that reconnects with
`Last-Event-ID` resumes exactly after what it had; `queued` events and pings carry no id.
"""

from __future__ import annotations

from collections.abc import Iterator

from flask import Blueprint, Response, request

from tasks.errors import InvalidParameter, JobNotFound, Unauthorized, Unavailable
from tasks.events import Event, EventType
from tasks.job import Job
from tasks.store import Store
from web import responses, sse
from web.apidoc import JSON, SSE, Schema, documented, reply
from web.auth import current_owner
from web.feed import Hub
from web.follow import Ping, Queued, follow
from web.services import services

bp = Blueprint("stream", __name__)

LOG_SIZE_LIMIT = 2**32  # no Redis list holds this many: an index past it needs no look-up


def _last_event_id(store: Store, job: Job) -> int:
    """The index of the last event the client has (-1: none yet), from `Last-Event-ID` or `?last_event_id`.

    It must be an index of the job's event log (InvalidParameter otherwise): a stream that starts after the end
    of the log would wait for events that never come.
    """
    header = request.headers.get("Last-Event-ID", "").strip()  # an empty header means none
    param, raw = ("Last-Event-ID", header) if header else ("last_event_id", request.args.get("last_event_id", ""))
    if not raw:
        return -1
    digits = raw.lstrip("0") or "0"
    index = int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 10 else -1
    if not 0 <= index < LOG_SIZE_LIMIT or not store.events(job.id, index):
        raise InvalidParameter(f"{param} must be the id of one of this job's events", param=param)
    return index


def _event(names: list[str], data: Schema) -> Schema:
    """One event of the stream, as OpenAPI 3.1 has `schema` describe each event of a stream."""
    return {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"enum": names},
            "data": {"type": "string", "contentMediaType": JSON, "contentSchema": data},
        },
    }


EVENTS = {
    "oneOf": [
        _event(["queued"], responses.QueuedEvent),
        _event([EventType.STARTED.value], responses.StartedEvent),
        _event([EventType.TOKEN.value], responses.TokenEvent),
        _event([EventType.REQUEUED.value], responses.RequeuedEvent),
        _event([kind.value for kind in EventType if kind.terminal], responses.Job),
    ]
}


@bp.get("/v1/jobs/<job_id>/events")
@documented(
    "jobEvents",
    "Follow a job's events (server-sent events)",
    "jobs",
    description=lambda s: (
        "`queued` (position, eta_s) whenever the queue ahead moves, then `started`, `token` (text, "
        "n), `requeued` if its worker died, and exactly one terminal event (`completed`, `failed`, `cancelled` or "
        f"`expired`, with the whole job); `: ping` comments at least every {s.sse_ping_s:g} s. Each event of the job's "
        "durable log carries its index as its SSE `id`: reconnect with `Last-Event-ID` (or `?last_event_id=`) to get "
        "exactly the rest."
    ),
    params=[
        {
            "name": "Last-Event-ID",
            "in": "header",
            "schema": {"type": "string"},
            "description": "the id of the last event the client has (an empty header counts as none)",
        },
        {
            "name": "last_event_id",
            "in": "query",
            "schema": {"type": "string"},
            "description": "the same, for clients that cannot set headers",
        },
    ],
    answers={200: reply("the stream: each event as `event` and its JSON `data`", EVENTS, SSE)},
    errors=[
        (
            InvalidParameter,
            "the id is not the index of one of this job's events (`param` names the header or query parameter)",
        ),
        Unauthorized,
        JobNotFound,
        Unavailable,
    ],
)
def job_events(job_id: str) -> Response:
    svc = services()
    job = svc.store.get(job_id, current_owner())
    svc.store.follow_live(job)  # its tokens, as they come
    return sse.response(job_stream(svc.store, svc.hub, job, _last_event_id(svc.store, job), svc.settings.sse_ping_s))


def job_stream(store: Store, hub: Hub, job: Job, after: int, ping_s: float) -> Iterator[str]:
    """Replay the job's events after index `after`, then follow it live until its terminal event.

    A client that left is noticed when a write fails (a ping at the latest), so the stream does not poll its
    socket: hundreds of waiting streams cost nothing between events.
    """
    yield "retry: 1000\n\n"
    for item in follow(store, hub, job, after=after, ping_s=ping_s):
        if isinstance(item, Ping):
            yield sse.comment("ping")
        elif isinstance(item, Queued):
            yield sse.event("queued", {"position": item.position, "eta_s": item.eta_s})
        elif isinstance(item, Event):  # a terminal event sends the job as it ended
            data = responses.Job.of(store.get(job.id)) if item.terminal else item.payload()
            yield sse.event(item.type.value, data, item.index)
