"""The dashboard's board: what a viewer may see of the queue (web/dashboard.py serves it, as a page and as JSON).

Privacy, the one rule (`Viewer.sees`): a user sees their own jobs named (id, prompt excerpt) and everyone else's
only counted, per anonymous user, never another user's name, id or prompt. An admin (`admin = true` in the keys
file) sees every job named with its owner, and may cancel any. In local mode nobody is an admin: each browser is a
visitor of its own, and anyone who can reach the server could be one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flask import url_for

from tasks.job import Job
from tasks.store import Board, DeviceLease, Minute
from web.auth import LOCAL_USER, current_owner, current_user
from web.html import excerpt
from web.services import services

FAILED = ("failed", "expired")


@dataclass(frozen=True)
class Viewer:
    """Who looks: the owner name of their jobs, and whether they are an admin."""

    name: str
    admin: bool

    def sees(self, owner: str) -> bool:
        """Whether this viewer may see a job of `owner` named: their own, or any for an admin."""
        return self.admin or owner == self.name


def viewer() -> Viewer:
    """Who looks at the dashboard (raises Unauthorized, as any API call)."""
    name = current_owner()
    user = current_user()
    return Viewer(name, bool(user and user.admin))


def board_view(who: Viewer) -> dict[str, Any]:
    """The dashboard as JSON, with what `who` may not see left out."""
    board = services().store.readings.board(who.sees)
    snap = board.snapshot
    return {
        "now": snap.now,
        "viewer": {"name": who.name, "admin": who.admin},
        "running": _running(board, who),
        "waiting": _waiting(board, who),
        "workers": [_worker(w) for w in snap.workers]
        + [
            {"device": d, "health": "down", "state": "bad"}
            for d in snap.devices
            if d not in {w.device for w in snap.workers}
        ],
        "models": [{"name": m.name, "state": m.state, "waiting": m.queue_depth} for m in snap.models],
        "failures": [_failure(job, who) for job in board.failures],
        "batches": _batches(who),
        "minutes": [_minute(m, snap.now) for m in board.minutes],
        "prefix_cache": _prefix_cache(snap.stats),
        "fairness": _fairness(board, who),
        "local_api": _local_api(board, who),
    }


def _fairness(board: Board, who: Viewer) -> dict[str, Any]:
    """Each flow's service, in the token units the fair order charges (the most served first: the viewer's own
    flows named, another user's only for an admin), and how many times batch work was set aside for interactive."""
    flows = []
    for flow, units in sorted(board.snapshot.service, key=lambda f: -f[1]):
        owner, _, kind = flow.partition("|")
        seen = who.sees(owner)
        flows.append(
            {
                "owner": owner if seen else None,
                "mine": owner == who.name,
                "priority": kind or "interactive",
                "tokens": round(units),
            }
        )
    return {"flows": flows, "preemptions": int(board.snapshot.stats.get("preempted", 0))}


def _local_api(board: Board, who: Viewer) -> dict[str, Any] | None:
    """In local mode, a browser's count of the API's jobs, so its page can say why they are another user's: the API
    callers (curl, the SDKs, `onelane run`) are all the user `local`, while each browser is a visitor of its own, so
    that its prompts stay private from other browsers and from anyone who calls the API. Anybody may list `local`'s
    jobs through the API, so these counts tell nobody anything new. None with keys configured, or for `local` itself."""
    if services().settings.keys_required or who.name == LOCAL_USER:
        return None
    return {
        "user": LOCAL_USER,
        "waiting": sum(1 for entry in board.waiting if entry.owner == LOCAL_USER),
        "running": sum(1 for job in board.running if job.owner == LOCAL_USER),
    }


def _prefix_cache(stats: dict[str, str]) -> dict[str, Any]:
    """The prefix cache since the counters began: lookups, the share that hit, prompt tokens it saved."""
    lookups, hits = int(stats.get("cache_lookups", 0)), int(stats.get("cache_hits", 0))
    return {
        "lookups": lookups,
        "hits": hits,
        "hit_rate": round(hits / lookups, 3) if lookups else None,
        "cached_tokens": int(stats.get("cache_tokens", 0)),
    }


def _named(job: Job, who: Viewer) -> dict[str, Any]:
    """A job the viewer may see: what it is, where it leads, and how to cancel it."""
    mine = job.owner == who.name
    return {
        "id": job.id,
        "owner": job.owner if who.admin else None,
        "mine": mine,
        "prompt": excerpt(job),
        "model": job.spec.model,
        "priority": job.spec.priority,
        "url": url_for("pages.job_page", job_id=job.id) if mine else None,
        "cancel_url": url_for("dashboard.cancel", job_id=job.id) if not job.status.ended else None,
    }


def _running(board: Board, who: Viewer) -> dict[str, Any]:
    snap, rows, others = board.snapshot, [], []
    device_of = {job_id: w.device for w in snap.workers for job_id in w.jobs}
    for job in board.running:
        if not who.sees(job.owner):
            others.append(job.owner)
            continue
        t, tokens = job.timings, job.usage.completion_tokens
        generating_s = snap.now - t.first_token_at if t.first_token_at else 0
        rows.append(
            {
                **_named(job, who),
                "tokens": tokens,
                "max_tokens": job.spec.params.max_tokens,
                "running_s": round(snap.now - (t.started_at or snap.now), 1),
                "device": device_of.get(job.id),
                "tok_s": round(tokens / generating_s, 1) if generating_s > 0 else None,
            }
        )
    slots = sum(w.slots for w in snap.workers)
    return {
        "jobs": rows,
        "count": len(board.running),
        "slots": slots,
        "others": {"jobs": len(others), "users": len(set(others))},
    }


def _waiting(board: Board, who: Viewer) -> dict[str, Any]:
    """The viewer's waiting jobs named, in queue order; everyone else's counted per user, in order of their first."""
    now, rows = board.snapshot.now, []
    others: dict[str, int] = {}
    for entry in board.waiting:
        if not who.sees(entry.owner):
            others[entry.owner] = others.get(entry.owner, 0) + 1
        elif entry.job is not None:  # (else its record is gone since the queue was read)
            rows.append(
                {
                    **_named(entry.job, who),
                    "position": entry.position,
                    "waited_s": round(now - entry.job.timings.queued_at, 1),
                }
            )
    return {
        "jobs": rows,
        "total": board.snapshot.queue_depth,
        "listed": len(board.waiting),
        "others": list(others.values()),
    }


def _batches(who: Viewer) -> dict[str, Any]:
    """The batches not ended: the viewer's own (an admin: all) with their counts; everyone else's only counted."""
    rows, others = [], []
    for b in services().batches.unended():
        if not who.sees(b.owner):
            others.append(b.owner)
            continue
        rows.append(
            {
                "id": b.id,
                "owner": b.owner if who.admin else None,
                "mine": b.owner == who.name,
                "status": b.status,
                "endpoint": b.endpoint,
                "created_at": b.created_at,
                "total": b.total,
                "completed": b.completed,
                "failed": b.failed,
            }
        )
    return {"batches": rows, "others": {"batches": len(others), "users": len(set(others))}}


def _failure(job: Job, who: Viewer) -> dict[str, Any]:
    """A recent failure: the viewer's own (or, for an admin, any) in full; another user's without who or what."""
    fields = {
        "status": job.status.value,
        "error": job.error.type if job.error else None,
        "at": job.timings.finished_at,
        "model": job.spec.model,
    }
    if not who.sees(job.owner):
        return {**fields, "mine": False}
    return {**_named(job, who), **fields, "message": job.error.message if job.error else None}


def _worker(w: DeviceLease) -> dict[str, Any]:
    """A live worker, with its health: `stalled` (no progress on its jobs for ONELANE_STALL_S), `late` (it missed a
    heartbeat), `loading`, `generating` or `idle`."""
    s = services().settings
    if w.progress_age_s is not None and w.progress_age_s > s.stall_s:
        health, state = "stalled", "bad"
    elif w.heartbeat_age_s > s.lease_s * 2 / 3:
        health, state = "late", "warn"
    else:
        health, state = ("loading" if w.loading else "generating" if w.jobs else "idle"), "ok"
    return {
        "device": w.device,
        "worker": w.worker,
        "pid": w.pid,
        "health": health,
        "state": state,
        "heartbeat_age_s": round(w.heartbeat_age_s, 2),
        "batch": w.batch,
        "slots": w.slots,
        "tok_s": w.tokens_per_s,
        "models": list(w.models),
        "active": w.active,
        "loading": w.loading,
        "cache_bytes": w.cache_bytes,
        "cache_entries": w.cache_entries,
    }


def _minute(m: Minute, now: float) -> dict[str, Any]:
    """One minute of the plots; the current one's rate counts only the seconds it has had."""
    seconds = min(60.0, max(1.0, now - m.start))
    return {
        "t": m.start,
        "admitted": m.admitted,
        "completed": m.ended.get("completed", 0),
        "failed": sum(m.ended.get(s, 0) for s in FAILED),
        "cancelled": m.ended.get("cancelled", 0),
        "tokens": m.tokens,
        "tok_s": round(m.tokens / seconds, 2),
        "started": m.started,
        "wait_mean_s": round(m.wait_sum_s / m.started, 3) if m.started else None,
        "wait_max_s": round(m.wait_max_s, 3) if m.started else None,
    }


def board_schema() -> dict[str, Any]:
    """The board's outline in /openapi.json (board_view builds it; its fields are for the dashboard's script)."""
    fields = {
        "now": {"type": "number"},
        "viewer": {"type": "object"},
        "running": {"type": "object"},
        "waiting": {"type": "object"},
        "workers": {"type": "array"},
        "models": {"type": "array"},
        "failures": {"type": "array"},
        "minutes": {"type": "array"},
        "prefix_cache": {"type": "object"},
        "fairness": {"type": "object", "description": "each flow's service in token units, and preemptions"},
        "batches": {"type": "object"},
        "local_api": {"type": ["object", "null"], "description": "local mode: the API user's jobs, counted"},
    }
    return {"type": "object", "properties": fields, "required": list(fields), "additionalProperties": False}
