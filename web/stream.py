"""Server-sent events for one job: position while it waits, then tokens, then exactly one terminal event."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, request, stream_with_context

from tasks.job import Job, JobStatus
from tasks.store import TERMINAL_EVENTS, Feed, Store
from web import services
from web.auth import current_owner

bp = Blueprint("stream", __name__)


def sse(event: str, data: dict[str, Any], event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _last_event_id() -> int:
    raw = request.headers.get("Last-Event-ID") or request.args.get("last_event_id") or "-1"
    try:
        return max(int(raw), -1)
    except ValueError:
        return -1


@bp.get("/v1/jobs/<job_id>/events")
def job_events(job_id: str) -> Response:
    svc = services()
    job = svc.store.get(job_id, current_owner())
    stream = job_stream(svc.store, job, _last_event_id(), svc.settings.sse_ping_s, svc.settings.watch_grace_s)
    return Response(
        stream_with_context(stream),
        mimetype="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def job_stream(store: Store, job: Job, after: int, ping_s: float, grace_s: float) -> Iterator[str]:
    """Replay the job's events after index `after`, then follow it live until its terminal event.

    While the job waits, a `queued` event (position, eta_s) is sent whenever its standing changes, and a
    comment ping keeps proxies from closing the stream. For a watched job each ping also renews the lease
    that keeps it in the queue, and only after the ping was written: a stream whose client left stops
    renewing within one ping.
    """
    feed = Feed(store, job.id, after)
    try:
        yield "retry: 1000\n\n"
        job = store.get(job.id)  # fresh, now that the feed is subscribed
        waiting = job.status is JobStatus.QUEUED
        if job.spec.watched and waiting:
            ping_s = min(ping_s, grace_s / 3)
            store.keep_watching(job)
        shown: tuple[int | None, float | None] | None = None
        moved = True  # recompute the standing once no more queue moves are pending
        next_ping = time.monotonic() + ping_s
        while True:
            event = feed.get(timeout_s=0 if moved else next_ping - time.monotonic())
            if event is None:
                if moved and waiting:
                    standing = store.standing(job)
                    if standing.position is not None and (standing.position, standing.eta_s) != shown:
                        shown = (standing.position, standing.eta_s)
                        yield sse("queued", {"position": standing.position, "eta_s": standing.eta_s})
                moved = False
            elif event["type"] == "moved":
                moved = True
            elif event["type"] in TERMINAL_EVENTS:
                yield sse(event["type"], store.get(job.id).public(), event["i"])
                return
            else:
                waiting = False
                data = {"index": event["i"], **{k: v for k, v in event.items() if k not in ("i", "type")}}
                yield sse(event["type"], data, event["i"])
            if time.monotonic() >= next_ping:
                yield ": ping\n\n"
                if waiting:
                    store.keep_watching(job)
                next_ping = time.monotonic() + ping_s
    finally:
        feed.close()
