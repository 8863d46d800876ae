"""Admission for a web request, whichever API it comes through: its jobs for the current caller, under their own
quota, with their doorbell (`admit`, `admit_jobs`); admitted with their feeds subscribed first, to be followed
(`admit_followed`), to their end (`run_one`), or cancelled together (`cancel_all`)."""

from __future__ import annotations

from contextlib import closing

from flask import request

from tasks.broker import Doorbell
from tasks.events import Event, EventType
from tasks.job import Job, JobSpec, new_job_id
from tasks.store import Store
from web.auth import current_user, visitor_address
from web.errors import ClientGone, job_error
from web.feed import Feed, Hub
from web.follow import CLIENT_GONE, Gone, cancel_quietly, follow
from web.services import services


def admit(spec: JobSpec, ttl_s: float, job_id: str | None = None) -> Job:
    """Admit a job for the current caller (their own quota applies; a local-mode browser shares its address's),
    with the message that wakes the worker."""
    return admit_jobs([(job_id or new_job_id(), spec)], ttl_s)[0]


def admit_jobs(jobs: list[tuple[str, JobSpec]], ttl_s: float, param: str | None = None) -> list[Job]:
    """Admit a request's jobs (ids and specs: one per answer it asks for) as `admit` does one, all or none in one
    step; more than the caller's quota allows at all is refused naming `param`."""
    svc = services()
    user = current_user()
    return svc.store.admit_all(
        jobs,
        ttl_s,
        quota=user.max_queued if user else None,
        doorbell=Doorbell.ring(svc.broker, jobs[0][0]),  # (one message runs what waits: one a request)
        address=visitor_address(),
        param=param,
    )


def admit_followed(
    store: Store, hub: Hub, jobs: list[tuple[str, JobSpec]], ttl_s: float, param: str | None = None
) -> tuple[list[Job], list[Feed]]:
    """Admit a request's jobs as `admit_jobs` does, each with its feed subscribed before it exists (nothing is
    missed); a refusal leaves no feed behind."""
    feeds = [Feed(store, hub, job_id, replay=False) for job_id, _ in jobs]
    try:
        return admit_jobs(jobs, ttl_s, param), feeds
    except BaseException:
        for feed in feeds:
            feed.close()
        raise


def cancel_all(store: Store, jobs: list[Job], why: tuple[str, str]) -> None:
    """Cancel every one of the request's jobs that has not ended."""
    for job in jobs:
        cancel_quietly(store, job, why)


def run_one(admission: tuple[JobSpec, float], param: str) -> Job:
    """Admit the job, follow it to its end (the connection watches it), and return it completed, read back whole;
    or raise what its other ending means to the caller."""
    svc = services()
    spec, ttl_s = admission
    (job,), (feed,) = admit_followed(svc.store, svc.hub, [(new_job_id(), spec)], ttl_s, param)
    with closing(feed):
        story = follow(svc.store, svc.hub, job, ping_s=svc.settings.sse_ping_s, environ=request.environ, feed=feed)
        for item in story:
            match item:
                case Gone():
                    cancel_all(svc.store, [job], CLIENT_GONE)
                    raise ClientGone()
                case Event(type=EventType.COMPLETED):
                    break
                case Event() if item.terminal:
                    raise job_error(svc.store.get(job.id), svc.settings.model_retry_s)
    return svc.store.read([job.id])[job.id]
