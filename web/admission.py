"""Admission for a web request: its jobs for the current caller, under their own quota, with their doorbell."""

from __future__ import annotations

from tasks.broker import Doorbell
from tasks.job import Job, JobSpec, new_job_id
from web.auth import current_user, visitor_address
from web.services import services


def admit(spec: JobSpec, ttl_s: float, job_id: str | None = None) -> Job:
    """Admit a job for the current caller (their own quota applies; a local-mode browser shares its address's),
    with the message that wakes the worker."""
    return admit_all([(job_id or new_job_id(), spec)], ttl_s)[0]


def admit_all(jobs: list[tuple[str, JobSpec]], ttl_s: float, param: str | None = None) -> list[Job]:
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
