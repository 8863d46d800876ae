"""Follow one job from the web: the one loop behind the SSE feed, OpenAI streams and blocking waits."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from tasks.job import Job, JobStatus
from tasks.store import TERMINAL_EVENTS, Store
from web.feed import Feed, Hub
from web.connection import client_connected

SOCKET_CHECK_S = 0.1  # how often a waiting request looks whether its client hung up


def follow(
    store: Store,
    hub: Hub,
    job: Job,
    *,
    after: int = -1,
    ping_s: float = 15.0,
    environ: dict[str, Any] | None = None,
    feed: Feed | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield the job's story as dicts with a "type", ending after exactly one terminal event:

    - {"type": "queued", "position", "eta_s"} while it waits, whenever its standing changes;
    - {"type": "ping"} every `ping_s` seconds (a watched, waiting job's lease is renewed right after);
    - the job's own events from the durable log after index `after`, each with its index "i";
    - {"type": "gone"} (and nothing more) if `environ`'s client closed its connection.

    A job that has ended gives what is left of its log after `after` (maybe nothing) and stops at once.

    `feed`, when given, was subscribed before `job` was admitted, and `job` is as admitted: nothing needs
    reading again before the first event.
    """
    admitted = feed is not None
    if not admitted and job.status.ended:
        yield from rest_of_log(store, job, after)
        return
    feed = feed or Feed(store, hub, job.id, after)
    try:
        job = job if admitted else store.get(job.id)  # fresh, now that the feed is subscribed
        if job.status.ended:  # it ended meanwhile
            yield from rest_of_log(store, job, after)
            return
        waiting, watched = job.status is JobStatus.QUEUED, job.spec.watched
        if watched:  # running too: if its worker dies, it waits again, and its lease must be renewed in time
            ping_s = min(ping_s, store.settings.watch_grace_s / 3)
            if waiting and not admitted:  # admission started its lease
                store.renew_watch(job.id)
        shown: tuple[int, float | None] | None = None
        moved = True  # recompute the standing once no more queue moves are pending
        if admitted and job.position is not None:  # as admitted: no need to ask again
            shown, moved = (job.position, job.eta_s), False
            yield {"type": "queued", "position": job.position, "eta_s": job.eta_s}
        next_ping = time.monotonic() + ping_s
        while True:
            wait = next_ping - time.monotonic()
            event = feed.get(timeout_s=0 if moved else min(wait, SOCKET_CHECK_S) if environ else wait)
            if event is None:
                if moved and waiting:
                    standing = store.standing(job)
                    if standing.position is not None and (standing.position, standing.eta_s) != shown:
                        shown = (standing.position, standing.eta_s)
                        yield {"type": "queued", "position": standing.position, "eta_s": standing.eta_s}
                moved = False
            elif event["type"] == "moved":
                moved = True
            elif event["type"] == "standing":  # the hub looked it up, for every stream at once
                if waiting and (event["position"], event["eta_s"]) != shown:
                    shown = (event["position"], event["eta_s"])
                    yield {"type": "queued", "position": event["position"], "eta_s": event["eta_s"]}
            else:
                waiting = event["type"] == "requeued"  # its worker died: it waits again, at the front
                moved = moved or waiting
                yield event
                if event["type"] in TERMINAL_EVENTS:
                    return
            if environ is not None and not client_connected(environ):
                yield {"type": "gone"}
                return
            if time.monotonic() >= next_ping:
                yield {"type": "ping"}
                if waiting and watched:
                    store.renew_watch(job.id)
                next_ping = time.monotonic() + ping_s
    finally:
        feed.close()


def rest_of_log(store: Store, job: Job, after: int) -> list[dict[str, Any]]:
    """An ended job's events after index `after`, at once: nothing more will come."""
    # its log is complete: the terminal event is written in the same script that ends the job
    return store.events(job.id, after + 1)
