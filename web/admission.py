"""Admission for a web request: a job for the current caller, under their own quota, with its doorbell."""

from __future__ import annotations

from tasks.broker import Doorbell
from tasks.job import Job, JobSpec, new_job_id
from web.auth import current_user, visitor_address
from web.services import services


def admit(spec: JobSpec, ttl_s: float, job_id: str | None = None) -> Job:
    """Admit a job for the current caller (their own quota applies; a local-mode browser shares its address's),
    with the message that wakes the worker."""
    svc = services()
    user = current_user()
    job_id = job_id or new_job_id()
    return svc.store.admit(
        job_id,
        spec,
        ttl_s,
        quota=user.max_queued if user else None,
        doorbell=Doorbell.ring(svc.broker, job_id),
        address=visitor_address(),
    )
