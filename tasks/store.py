"""The only module that talks to Redis about jobs.

A job is a hash at keys.job(id) with the fields `spec` (JobSpec JSON, fixed at admission), `owner`,
`status`, `queued_at`, `deadline`, `started_at`, `first_token_at`, `finished_at`, `attempts`,
`finish_reason`, `error` (JSON), `prompt_tokens`, `cached_tokens`, `completion_tokens` and, once a running job is asked to
stop, `cancel_requested` (the completion tokens counted at that moment). Its output text is a string at
keys.output(id); its event log a list at keys.events(id).
Every change that must not interleave with another is one Lua script in tasks/lua/.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import redis

from tasks import keys
from tasks.broker import Doorbell
from tasks.connection import connect
from tasks.errors import JobAlreadyEnded, JobNotFound, LeaseLost, ModelUnavailable, QueueFull, QuotaExceeded
from tasks.events import Event
from tasks.job import Job, JobSpec, JobStatus, Timings, error_json, history_digest, history_prefix
from tasks.scripts import ARGS, BELL, Scripts
from tasks.settings import Settings


MODEL_RECORD_TTL_S = 7 * 86400  # a model's load record (keys.model) outlives no week without news
BOARD_WAITING = 500  # waiting jobs the dashboard reads one by one, in queue order; it only counts the rest
BOARD_MINUTES = 60  # the dashboard plots the last hour
VISITORS_PER_ADDRESS = 4  # local mode: browser visitors of one client address that may have jobs waiting at once


@dataclass(frozen=True)
class DeviceLease:
    """A live worker, as its lease in Redis shows it."""

    device: str
    worker: str
    pid: int
    heartbeat_age_s: float
    jobs: tuple[str, ...]  # the jobs it runs now
    progress_age_s: float | None  # while it runs jobs: since it last started one or produced a token
    batch: int  # jobs in its batch, as it last reported
    slots: int  # the most its batch holds (its ONELANE_MAX_BATCH)
    tokens_per_s: float  # tokens it generated per second lately
    models: tuple[str, ...] = ()  # the models it has loaded
    active: str = ""  # the model its batch runs ('' when the batch is empty)
    loading: str = ""  # the model it loads now ('' when none)
    cache_bytes: int = 0  # what its prefix cache holds
    cache_entries: int = 0


@dataclass(frozen=True)
class BatchReport:
    """What a worker tells with each lease renewal: its batch now, and the work it did since its last report."""

    batch: int
    slots: int
    tokens_per_s: float
    steps: int
    decode_s: float
    prefill_s: float
    prefill_tokens: int
    models: tuple[str, ...] = ()
    active: str = ""
    loading: str = ""
    cache_lookups: int = 0  # prefix cache: lookups, hits and prompt tokens they saved since the last report
    cache_hits: int = 0
    cache_tokens: int = 0
    cache_bytes: int = 0  # ... and what it holds now
    cache_entries: int = 0

    NAMES: ClassVar[tuple[str, ...]] = ARGS["lease"][5:]  # what lease.lua takes of a report, by name

    def fields(self) -> dict[str, object]:
        """The report as lease.lua takes it, by name."""
        return {"batch": self.batch, "slots": self.slots, "tok_s": f"{self.tokens_per_s:.1f}", "steps": self.steps,
                "decode_s": f"{self.decode_s:.6f}", "prefill_s": f"{self.prefill_s:.6f}",
                "prefill_tokens": self.prefill_tokens, "models": ",".join(self.models), "active": self.active,
                "loading": self.loading, "cache_lookups": self.cache_lookups, "cache_hits": self.cache_hits,
                "cache_tokens": self.cache_tokens, "cache_bytes": self.cache_bytes,
                "cache_entries": self.cache_entries}  # fmt: skip


@dataclass(frozen=True)
class ModelState:
    """A served model as the workers report it: `loaded`, `loading`, `failed` (until `retry_in_s`) or `unloaded`."""

    name: str
    state: str
    queue_depth: int
    load_s: float | None = None  # how long its last load took
    bytes: int | None = None  # its weights' size once loaded
    error: str | None = None  # why it failed to load
    retry_in_s: float | None = None  # when a failed model is tried again


@dataclass(frozen=True)
class Snapshot:
    now: float
    queue_depth: int
    in_progress: int
    stats: dict[str, str]
    workers: list[DeviceLease]
    models: list[ModelState]
    devices: tuple[str, ...] = ()  # every device seen, with a live worker or not


@dataclass(frozen=True)
class Minute:
    """One minute, as the scripts recorded it when things happened (per_minute in tasks/lua/common.lua)."""

    start: float  # seconds since the epoch
    admitted: int
    ended: dict[str, int]  # jobs that ended in it, by status
    tokens: int  # tokens generated in it
    started: int  # jobs that started in it (first runs only)
    wait_sum_s: float  # the queue waits of those jobs
    wait_max_s: float

    @classmethod
    def parse(cls, index: int, fields: dict[str, str]) -> Minute:
        """The minute `index` (seconds since the epoch // 60) from its hash."""
        n = {name: float(value) for name, value in fields.items()}
        ended = {name.removeprefix("ended:"): int(x) for name, x in n.items() if name.startswith("ended:")}
        return cls(index * 60.0, int(n.get("admitted", 0)), ended, int(n.get("tokens", 0)), int(n.get("started", 0)),
                   n.get("wait_sum", 0.0), n.get("wait_max", 0.0))  # fmt: skip


@dataclass(frozen=True)
class Waiting:
    """A waiting job on the dashboard: its owner and place, and the job itself only where it may be shown."""

    id: str
    owner: str
    position: int
    job: Job | None


@dataclass(frozen=True)
class Board:
    """The queue as the dashboard shows it."""

    snapshot: Snapshot
    running: list[Job]  # by start
    waiting: list[Waiting]  # the first BOARD_WAITING in queue order; snapshot.queue_depth counts them all
    failures: list[Job]  # failed or expired, newest first
    minutes: list[Minute]  # the last BOARD_MINUTES, oldest first, the current one last


@dataclass(frozen=True)
class Standing:
    """Where a waiting job stands: position 1 starts at the next free slot; eta_s is None until a job has been
    timed."""

    position: int | None
    eta_s: float | None


@dataclass(frozen=True)
class Estimate:
    """The batch's slots as a waiting job sees them (see service_estimate in tasks/lua/common.lua)."""

    mean_s: float  # recent jobs' mean service time, start to end
    timed: bool  # whether any job has been timed yet
    free_s: tuple[float, ...]  # when each slot frees, in seconds from now, soonest first

    @classmethod
    def parse(cls, reply: list[Any]) -> tuple[Estimate, list[Any]]:
        """An estimate from the front of a script's reply, and what follows it."""
        mean, timed, n, *rest = reply
        n = int(n)
        return cls(float(mean), int(timed) > 0, tuple(float(x) for x in rest[:n])), rest[n:]

    def eta(self, position: int, load_s: float = 0.0) -> float | None:
        """When the job at `position` should start: the slots free in turn, each taking the next waiting job; and
        its model loads first (`load_s`) if no worker has it loaded."""
        if not self.timed:
            return None
        k = position - 1
        return round(self.free_s[k % len(self.free_s)] + (k // len(self.free_s)) * self.mean_s + load_s, 3)


@dataclass(frozen=True)
class Claim:
    """What a claim found: the job it started for the worker, or the job at the head of the queue, unclaimed."""

    job: Job
    started: bool
    solo: bool  # the job must run alone (it was in a batch that failed: see release() in tasks/lua/common.lua)
    behind: int  # jobs waiting behind it (the worker need not look again for more while there are none)


@dataclass(frozen=True)
class Switch:
    """The next job needs another model than the worker's batch runs (`load`: one the worker has not loaded), and
    no job of a model it has ready may go ahead of it any longer."""

    head: str
    model: str
    load: bool


class Store:
    """Verbs on jobs; each either one Redis command, one pipeline, or one script."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.redis = client
        self.settings = settings
        self.scripts = Scripts(client)

    @classmethod
    def connect(cls, settings: Settings) -> Store:
        """A store on its own connection pool to `settings`' Redis (a process's one store)."""
        return cls(connect(settings.effective_redis_url, settings.redis_timeout_s), settings)

    def load_scripts(self) -> None:
        """Load every script into Redis again (after a restart or SCRIPT FLUSH)."""
        self.scripts.load()

    # --- the web's verbs -------------------------------------------------------------------------

    def create(self, job_id: str, spec: JobSpec, ttl_s: float, quota: int | None = None) -> Job:
        """Admit a job (see admit) and read it back."""
        self.admit(job_id, spec, ttl_s, quota)
        return self.get(job_id)

    def admit(
        self, job_id: str, spec: JobSpec, ttl_s: float, quota: int | None = None, doorbell: Doorbell | None = None,
        address: str | None = None, line: bool = False,
    ) -> Job:
        """Admit a job in fair order, or raise QueueFull / QuotaExceeded leaving nothing behind.

        `quota` is the owner's bound on waiting jobs (default: the server's per-user bound); `doorbell`, the
        job's dramatiq message, is enqueued in the same step. `address`, for a local-mode browser visitor: its
        client address, whose visitors share the quota, at most VISITORS_PER_ADDRESS of them with jobs waiting.
        A batch's `line` is admitted once only (a job of that id, admitted before, is returned as it stands),
        outside the owner's quota and listing: the batch bounds its own lines in the queue (web/batch_runner.py).
        Returns the job as admitted, with its position and ETA, without reading it back.
        """
        s = self.settings
        grace = s.watch_grace_s if spec.watched else 0
        quota = 0 if line else quota or s.max_queued_per_user
        config = s.model_named(spec.model)
        history = ""  # a chat's history so far: a worker whose prefix cache holds it may be preferred
        if spec.messages and len(spec.messages) > 1 and config is not None:
            history = history_digest(history_prefix(config.cache_key(), s.cache_scope(spec.owner)), spec.messages[:-1])
        verdict, *rest = self.scripts.run(
            "admit", id=job_id, owner=spec.owner, spec=spec.model_dump_json(), ttl_s=ttl_s, result_ttl_s=s.result_ttl_s,
            watch_grace_s=grace, max_queue=s.max_queue, max_per_user=quota, max_tokens=spec.params.max_tokens,
            slots=s.max_batch, **_bell(doorbell), model=spec.model, **{"class": spec.priority},
            cost=s.cost_of(spec.owner, spec.priority), visitors=keys.address_visitors(address) if address else "",
            max_visitors=VISITORS_PER_ADDRESS, history=history, line="1" if line else "",
        )
        if verdict == "exists":
            return self.get(job_id)
        if verdict == "queue_full":
            raise QueueFull(f"the queue is full ({s.max_queue} jobs waiting); try again later", retry_after_s=rest[0])
        if verdict == "quota_exceeded":
            raise QuotaExceeded(f"you already have {quota} jobs waiting; try again later", retry_after_s=rest[0])
        if verdict == "address_quota":
            raise QuotaExceeded(f"the browsers at your address already have {quota} jobs waiting; try again later",
                                retry_after_s=rest[0])  # fmt: skip
        if verdict == "address_visitors":
            raise QuotaExceeded(f"{VISITORS_PER_ADDRESS} other browsers at your address already have jobs waiting; "
                                "try again later", retry_after_s=rest[0])  # fmt: skip
        if verdict == "model_unavailable":
            raise ModelUnavailable(f"the model {spec.model!r} is unavailable: {rest[1]}", retry_after_s=rest[0])
        queued_at, deadline, position, load_s, *rest = rest
        estimate, _ = Estimate.parse(rest)
        return Job(
            id=job_id, spec=spec, status=JobStatus.QUEUED, deadline=float(deadline),
            timings=Timings(queued_at=float(queued_at)), position=int(position),
            eta_s=estimate.eta(int(position), float(load_s)),
        )  # fmt: skip

    def keep_watching(self, job: Job) -> None:
        """Renew a watched, waiting job's lease: its client (a stream, or polling) is still there."""
        if job.spec.watched and job.status is JobStatus.QUEUED:
            self.renew_watch(job.id)

    def renew_watch(self, job_id: str) -> None:
        """Renew the job's watch lease if it has one (a watched job that waits); harmless otherwise."""
        self.scripts.run("watch", id=job_id)

    def get(self, job_id: str, owner: str | None = None) -> Job:
        """The job as it stands now, with its position while it waits. Another owner's job is not found."""
        for _ in range(3):
            pipe = self.redis.pipeline(transaction=False)
            pipe.hgetall(keys.job(job_id))
            pipe.get(keys.output(job_id))
            fields, output = pipe.execute()
            if not fields or (owner is not None and fields.get("owner") != owner):
                raise JobNotFound(f"no job {job_id!r}", param="id")
            job = Job.from_redis(job_id, fields, output or "")
            if job.status is not JobStatus.QUEUED:
                return job
            standing = self.standing(job)
            if standing.position is not None:
                return job.model_copy(update={"position": standing.position, "eta_s": standing.eta_s})
            # it left the queue between the two reads (it started, or ended): read it again
        return job

    def read(self, job_ids: list[str]) -> dict[str, Job]:
        """The jobs of those ids still on record, as they stand, in one round trip (no position read)."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hgetall(keys.job(job_id))
            pipe.get(keys.output(job_id))
        replies = pipe.execute()
        return {job_id: Job.from_redis(job_id, fields, output or "")
                for job_id, fields, output in zip(job_ids, replies[::2], replies[1::2]) if fields}  # fmt: skip

    def list(self, owner: str, limit: int = 50) -> list[Job]:
        """The owner's most recent jobs, newest first."""
        ids = self.redis.zrevrange(keys.user_jobs(owner), 0, limit - 1)
        jobs = []
        for job_id in ids:
            try:
                jobs.append(self.get(job_id, owner))
            except JobNotFound:  # ended and past its result TTL
                continue
        return jobs

    def cancel(self, job_id: str, owner: str, wait_s: float = 0.0, error: tuple[str, str] | None = None) -> Job:
        """Cancel a waiting job now; flag a running one and wait up to `wait_s` for the worker to end it.

        Cancelling a job that is already cancelled is harmless; one that ended otherwise is JobAlreadyEnded.
        `error` (type, message) records why, e.g. ("client_gone", ...) when the client hung up.
        """
        with self.redis.pubsub(ignore_subscribe_messages=True) as sub:
            sub.subscribe(keys.channel(job_id))  # before the cancel, so the worker's answer cannot be missed
            err = error_json(*error) if error else ""
            found = self.scripts.run("cancel", id=job_id, owner=owner, result_ttl_s=self.settings.result_ttl_s, error=err)
            if found == "not_found":
                raise JobNotFound(f"no job {job_id!r}", param="id")
            if found not in ("queued", "cancelling", JobStatus.CANCELLED.value):
                raise JobAlreadyEnded(f"job {job_id!r} already ended: {found}", param="id")
            deadline = time.monotonic() + wait_s
            while found == "cancelling" and (left := deadline - time.monotonic()) > 0:
                message = sub.get_message(timeout=left)
                if message and Event.from_message(message["data"]).terminal:
                    break
        return self.get(job_id, owner)

    def standing(self, job: Job) -> Standing:
        """Position and ETA of a waiting job: its rank in the fair order, times the recent mean service time."""
        return self.standings([job.id])[0]

    def standings(self, job_ids: list[str]) -> list[Standing]:
        """The standing of each job, in one call (Standing(None, None) for a job that does not wait)."""
        estimate, flat = Estimate.parse(self.scripts.run("position", slots=self.settings.max_batch, ids=job_ids))
        return [Standing(int(p), estimate.eta(int(p), float(load_s))) if p else Standing(None, None)
                for p, load_s in zip(flat[::2], flat[1::2])]  # fmt: skip

    def events(self, job_id: str, start: int = 0) -> list[Event]:
        """The job's durable events from index `start` on."""
        raw = self.redis.lrange(keys.events(job_id), start, -1)
        return [Event.decode(start + n, event) for n, event in enumerate(raw)]

    def ping(self) -> bool:
        return bool(self.redis.ping())

    # --- the worker's verbs: `worker` is the id of the worker process acting ---------------------

    def take_device(self, worker: str, report: BatchReport | None = None) -> str:
        """Take this device's lease for `worker` (or renew it): 'ok', or the id of the worker holding it."""
        return self._lease("take", worker, report)

    def renew_device(self, worker: str, report: BatchReport | None = None) -> str:
        """Renew the lease `worker` holds: 'ok'; 'lapsed' if it lapsed (the worker must stop: its jobs may have been
        taken back); or the id of the worker that took it."""
        return self._lease("renew", worker, report)

    def _lease(self, mode: str, worker: str, report: BatchReport | None) -> str:
        lease_ms = int(self.settings.lease_s * 1000)
        told = report.fields() if report else dict.fromkeys(BatchReport.NAMES, "")
        return str(self.scripts.run("lease", device=self.settings.device, worker=worker, pid=os.getpid(),
                                    lease_ms=lease_ms, mode=mode, **told))

    def claim_next(
        self, worker: str, want: str | None = None, active: str = "", loaded: tuple[str, ...] | None = None
    ) -> Claim | Switch | None:
        """Atomically start the next job for `worker` if it is `want` (any job: "*"); else tell which job is next,
        unclaimed (the worker measures it, and names it when it fits). The next job is the fair order's head, or a
        job of the model the batch runs (`active`; '' for an empty batch) or of a `loaded` one, within the switch
        bound (see tasks/lua/claim.lua); past it, a Switch. None when nothing waits. `loaded` defaults to every
        model served (a worker that keeps them all).

        Raises LeaseLost if `worker` no longer holds the device (it must stop: another worker took over).
        """
        s = self.settings
        run_life = int(s.job_time_limit_s + s.result_ttl_s)
        loaded = tuple(m.name for m in s.catalog) if loaded is None else loaded
        claimed = self.scripts.run("claim", result_ttl_s=s.result_ttl_s, run_life_s=run_life, device=s.device,
                                   worker=worker, want=want or "", active=active, switch_wait_s=s.model_switch_wait_s,
                                   affinity_s=s.cache_affinity_s, loaded=loaded)
        if claimed == "lost":
            raise LeaseLost(f"worker {worker} lost the lease of device {self.settings.device}")
        if not claimed:
            return None
        if claimed[0] in ("switch", "load"):
            return Switch(claimed[1], claimed[2], load=claimed[0] == "load")
        verdict, job_id, flat, behind = claimed
        fields = dict(zip(flat[::2], flat[1::2]))
        # no output yet: it starts now, or has not started
        return Claim(Job.from_redis(job_id, fields, ""), verdict == "started", fields.get("solo") == "1", int(behind))

    def claim_now(self, worker: str) -> Job | None:
        """Start the next job in fair order whatever its size and model (a worker with every model loaded and no
        budget to keep; tests)."""
        claim = self.claim_next(worker, want="*")
        assert not isinstance(claim, Switch), "every model is loaded"
        return claim.job if claim else None

    # --- models: what the worker tells of them, for admission, ETAs and health checks --------------------------

    def model_loading(self, name: str, worker: str) -> None:
        self._model(name, state="loading", worker=worker)

    def model_loaded(self, name: str, worker: str, load_s: float, size: int) -> None:
        self._model(name, state="loaded", worker=worker, load_s=f"{load_s:.3f}", bytes=size, error="")

    def model_unloaded(self, name: str, worker: str) -> None:
        self._model(name, state="unloaded", worker=worker)

    def model_failed(self, name: str, worker: str, message: str) -> int:
        """Record that `name` failed to load and fail its waiting jobs (model_unavailable); returns how many."""
        s = self.settings
        return int(self.scripts.run("model_failed", model=name, message=message, retry_s=s.model_retry_s,
                                    result_ttl_s=s.result_ttl_s, worker=worker))

    def _model(self, name: str, **fields: object) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(keys.model(name), mapping=fields)  # type: ignore[arg-type]
        pipe.expire(keys.model(name), MODEL_RECORD_TTL_S)
        pipe.execute()

    def append(self, job_id: str, n_tokens: int, text: str, prompt_tokens: int, worker: str,
               start: tuple[int, int] | None = None, cached_tokens: int = 0, pipe: Any = None) -> Any:  # fmt: skip
        """Record generated text as one token event (n_tokens 0 and no text: progress without a token, as in a long
        prefill); true when the job must stop (cancelled, or taken away). `start`: the run's tokens and output bytes
        before this text, so that a retried write appends only what did not get there (None: at the end).
        `cached_tokens`: of the prompt's, those read from the prefix cache."""
        where = start if start is not None else ("", "")
        return self.scripts.run("append", pipe, id=job_id, n_tokens=n_tokens, text=text, prompt_tokens=prompt_tokens,
                                worker=worker, from_n=where[0], from_b=where[1], cached_tokens=cached_tokens)

    def finish(
        self,
        job_id: str,
        status: JobStatus,
        worker: str,
        *,
        finish_reason: str | None = None,
        error: tuple[str, str] | None = None,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        stop_seen_at: int | None = None,
        cached_tokens: int = 0,
        kept_as: tuple[str, str] | None = None,
        pipe: Any = None,
    ) -> Any:
        """End a job `worker` runs; false if it was not running there (it has its one terminal state). `kept_as`:
        the prefix cache's key (model key, scope) under which the worker kept the job's KV state, so a follow-up of
        this chat can be steered to this device."""
        err = error_json(*error) if error else ""
        s = self.settings
        seen = "" if stop_seen_at is None else stop_seen_at
        kept = history_prefix(*kept_as) if kept_as else ""
        return self.scripts.run("finish", pipe, id=job_id, status=status.value, finish_reason=finish_reason or "",
                                error=err, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                result_ttl_s=s.result_ttl_s, worker=worker, stop_seen_at=seen,
                                cached_tokens=cached_tokens, kept=kept)

    def hand_back(self, job_id: str, worker: str, why: str = "worker_crashed", shared: bool = False,
                  pipe: Any = None) -> Any:  # fmt: skip
        """Release a job `worker` runs but cannot finish: requeued at the front, or failed after max_attempts.
        `why`: worker_crashed (it could not record the outcome), generation_error (its batch's step failed), or
        stopping (the worker shuts down in good order: the run does not count as an attempt). `shared`: the job
        ran with others, so the failure is not blamed on it (see release() in tasks/lua/common.lua). Returns
        [id, verdict], or [] if it does not run there."""
        s = self.settings
        return self.scripts.run("recover", pipe, max_attempts=s.max_attempts, ttl_s=s.job_ttl_s,
                                result_ttl_s=s.result_ttl_s, id=job_id, worker=worker, why=why,
                                shared="1" if shared else "")

    def housekeep(self, doorbell: Doorbell | None = None) -> tuple[int, list[tuple[str, str]]]:
        """One periodic round: end waiting jobs past their deadline (expired) or whose watcher left (client_gone),
        release running jobs whose worker lost its device (requeued at the front, or failed after max_attempts),
        and ring `doorbell` if jobs wait and no message is pending. Returns (jobs waiting, [(job id, verdict)])."""
        s = self.settings
        waiting, *flat = self.scripts.run("housekeep", max_attempts=s.max_attempts, ttl_s=s.job_ttl_s,
                                          result_ttl_s=s.result_ttl_s, limit=500, **_bell(doorbell))
        return int(waiting), list(zip(flat[::2], flat[1::2]))

    def ring(self, doorbell: Doorbell) -> bool:
        """Push the worker's doorbell unless one is pending; True if pushed."""
        return bool(self.scripts.run("ring", **_bell(doorbell)))

    def drop_device(self, pid: int) -> bool:
        """Free this device if the process `pid` (known dead) holds it."""
        return bool(self.scripts.run("drop_lease", device=self.settings.device, field="pid", value=pid))

    def release_device(self, worker: str) -> bool:
        """Free this device if `worker` (stopped in good order: nothing of it runs on the device) holds it."""
        return bool(self.scripts.run("drop_lease", device=self.settings.device, field="worker", value=worker))

    def watch_device(self) -> tuple[int | None, list[str]]:
        """The pid holding this device, and the jobs ended as stalled (no progress for stall_s s) there."""
        s = self.settings
        pid, *stalled = self.scripts.run("stall", device=s.device, stall_s=s.stall_s, result_ttl_s=s.result_ttl_s)
        return (int(pid) if pid else None), stalled

    def live_slots(self) -> int:
        """The slots of every live worker's batch (its ONELANE_MAX_BATCH, as its lease reports it)."""
        devices = list(self.redis.smembers(keys.DEVICES))
        pipe = self.redis.pipeline(transaction=False)
        for name in devices:
            pipe.hmget(keys.device(name), "worker", "slots")
        return sum(int(slots or 0) for worker, slots in pipe.execute() if worker)

    def snapshot(self) -> Snapshot:
        """Everything /readyz and /metrics report, read in two pipelines."""
        devices = sorted(self.redis.smembers(keys.DEVICES))
        catalog = [m.name for m in self.settings.catalog]
        pipe = self.redis.pipeline(transaction=False)
        pipe.time()
        pipe.zcard(keys.QUEUE)
        pipe.zrange(keys.IN_PROGRESS, 0, -1)
        pipe.hgetall(keys.STATS)
        for name in catalog:
            pipe.zcard(keys.model_queue(name))
            pipe.hgetall(keys.model(name))
        for name in devices:
            pipe.hgetall(keys.device(name))
        now_parts, depth, running, stats, *rest = pipe.execute()
        per_model, leases = rest[: 2 * len(catalog)], rest[2 * len(catalog) :]
        now = now_parts[0] + now_parts[1] / 1e6
        pipe = self.redis.pipeline(transaction=False)
        for job_id in running:
            pipe.hget(keys.job(job_id), "worker")
        runs_on = dict(zip(running, pipe.execute()))
        workers = []
        for name, lease in zip(devices, leases):
            if "worker" not in lease:  # no lease (or a stray record of a lapsed one's progress)
                continue
            jobs = tuple(job_id for job_id, worker in runs_on.items() if worker == lease["worker"])
            progress = float(lease.get("progress") or lease["since"])
            workers.append(
                DeviceLease(name, lease["worker"], int(lease.get("pid", 0)), now - float(lease["beat"]), jobs,
                            now - progress if jobs else None, int(lease.get("batch", 0)), int(lease.get("slots", 0)),
                            float(lease.get("tok_s", 0)), tuple(filter(None, lease.get("models", "").split(","))),
                            lease.get("active", ""), lease.get("loading", ""), int(lease.get("cache_bytes", 0)),
                            int(lease.get("cache_entries", 0)))  # fmt: skip
            )
        models = [_model_state(name, int(n), record, workers, now)
                  for name, n, record in zip(catalog, per_model[::2], per_model[1::2])]  # fmt: skip
        return Snapshot(now, int(depth), len(running), stats, workers, models, tuple(devices))

    def board(self, reveal: Callable[[str], bool]) -> Board:
        """What the queue dashboard shows, read in a few pipelines. A waiting job's record (its prompt) is read
        only if `reveal(its owner)`: the others are only counted."""
        snap = self.snapshot()
        first = int(snap.now // 60) - BOARD_MINUTES + 1
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrange(keys.IN_PROGRESS, 0, -1)
        pipe.zrange(keys.QUEUE, 0, BOARD_WAITING - 1)
        pipe.lrange(keys.FAILURES, 0, -1)
        for index in range(first, first + BOARD_MINUTES):
            pipe.hgetall(keys.minute(index))
        running, waiting, failed, *minutes = pipe.execute()
        pipe = self.redis.pipeline(transaction=False)
        for job_id in waiting:
            pipe.hget(keys.job(job_id), "owner")
        owners = pipe.execute()
        shown = {job_id for job_id, owner in zip(waiting, owners) if owner and reveal(owner)}
        jobs = self._records([*running, *shown, *failed])
        queue = [Waiting(job_id, owner, n, jobs.get(job_id))
                 for n, (job_id, owner) in enumerate(zip(waiting, owners), 1) if owner]  # fmt: skip
        return Board(snap, [jobs[i] for i in running if i in jobs], queue, [jobs[i] for i in failed if i in jobs],
                     [Minute.parse(first + n, fields) for n, fields in enumerate(minutes)])  # fmt: skip

    def _records(self, job_ids: list[str]) -> dict[str, Job]:
        """The jobs still on record among `job_ids`, without their output."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hgetall(keys.job(job_id))
        return {job_id: Job.from_redis(job_id, fields, "") for job_id, fields in zip(job_ids, pipe.execute())
                if fields.get("spec")}  # fmt: skip

    def listen(self) -> Any:
        """A pub/sub subscribed to the ids of running jobs asked to stop, and to the queue's moves."""
        sub = self.redis.pubsub(ignore_subscribe_messages=True)
        sub.subscribe(keys.CANCELS, keys.QUEUE_MOVED)
        return sub

    def count(self, field: str, n: int = 1) -> None:
        """Add to one of the counters behind /metrics."""
        self.redis.hincrby(keys.STATS, field, n)

    def waiting(self) -> int:
        """How many jobs wait."""
        return int(self.redis.zcard(keys.WAITING))


def _model_state(name: str, depth: int, record: dict[str, str], workers: list[DeviceLease], now: float) -> ModelState:
    """A model's state: what live workers report (loaded, loading) comes first; a failure holds until its retry."""
    retry_at = float(record.get("retry_at") or 0)
    if any(name in w.models for w in workers):
        state = "loaded"
    elif any(w.loading == name for w in workers):
        state = "loading"
    elif record.get("state") == "failed" and retry_at > now:
        state = "failed"
    else:
        state = "unloaded"
    return ModelState(
        name, state, depth, float(record["load_s"]) if record.get("load_s") else None,
        int(record["bytes"]) if record.get("bytes") else None, record.get("error") or None if state == "failed" else None,
        round(retry_at - now, 3) if state == "failed" else None,
    )  # fmt: skip


def _bell(doorbell: Doorbell | None) -> dict[str, str | bytes]:
    """A doorbell as the scripts take it (scripts.BELL): queue key, hash key, message id, payload ('' for none)."""
    if doorbell is None:
        return dict.fromkeys(BELL, "")
    return dict(zip(BELL, (doorbell.queue_key, doorbell.messages_key, doorbell.message_id, doorbell.payload)))
