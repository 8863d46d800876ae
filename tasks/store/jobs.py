"""The web's verbs on jobs: admit, read, list, cancel, and where a waiting job stands.

A job is a hash at keys.job(id) with the fields `spec` (JobSpec JSON, fixed at admission), `owner`, `status`,
`queued_at`, `deadline`, `started_at`, `first_token_at`, `finished_at`, `attempts`, `finish_reason`, `error` (JSON),
`prompt_tokens`, `cached_tokens`, `completion_tokens` and, once a running job is asked to stop, `cancel_requested`
(the completion tokens counted at that moment). Its output text is a string at keys.output(id); its event log a
list at keys.events(id). Every change that must not interleave with another is one Lua script (tasks/scripts.py).
"""

from __future__ import annotations

import builtins
import math
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NoReturn, cast

import redis

from tasks import eta, keys
from tasks.broker import Doorbell
from tasks.connection import connect
from tasks.context import window_of
from tasks.errors import (
    InvalidRequest,
    JobAlreadyEnded,
    JobNotFound,
    ModelUnavailable,
    Overloaded,
    QueueFull,
    QuotaExceeded,
)
from tasks.events import Event
from tasks.job import Job, JobSpec, JobStatus, Timings, error_json, history_digest
from tasks.scripts import Scripts, bell
from tasks.settings import PREFILL_BATCH, Settings
from tasks.store import images
from tasks.store.memory import MemoryGuard
from tasks.store.readings import Readings
from tasks.store.upkeep import Upkeep
from tasks.store.worker import WorkerStore
from tasks.users import turn_share

VISITORS_PER_ADDRESS = 4  # local mode: browser visitors of one client address that may have jobs waiting at once
#: an image in a prompt, as its estimate (and ETA) counts it before the worker has: the 256 tokens a Gemma 3 image
#: is, at 4 characters a token (the worker reports the real count, which the job is charged as it ends)
IMAGE_CHARS = 1024


@dataclass(frozen=True)
class Standing:
    """Where a waiting job stands: position is 1 + the jobs that start before it (1: it starts at the next free slot,
    or takes a batch-class job's); eta_s is when it should start, in seconds from now (tasks/eta.py)."""

    position: int | None
    eta_s: float | None


class Store:
    """The web's verbs on jobs, each one Redis command, one pipeline, or one script; and the other audiences' parts
    of the store on the same connection: `for_worker(id)`, `readings`, `upkeep`."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.redis = client
        self.settings = settings
        self.scripts = Scripts(client)
        self.memory = MemoryGuard(client, settings.redis_memory_bytes)  # (new work waits while Redis is full)

    @classmethod
    def connect(cls, settings: Settings) -> Store:
        """A store on its own connection pool to `settings`' Redis (a process's one store)."""
        return cls(connect(settings.effective_redis_url, settings.redis_timeout_s), settings)

    def load_scripts(self) -> None:
        """Load every script into Redis again (after a restart or SCRIPT FLUSH)."""
        self.scripts.load()

    def for_worker(self, worker: str) -> WorkerStore:
        """The worker process `worker`'s verbs (its device lease, its jobs' claims, writes and ends)."""
        return WorkerStore(self.redis, self.settings, self.scripts, worker)

    @cached_property
    def readings(self) -> Readings:
        """What health checks, /metrics and the dashboard read."""
        return Readings(self.redis, self.settings)

    @cached_property
    def upkeep(self) -> Upkeep:
        """Housekeeping rounds, the doorbell, the supervisor's look at the device, the counters."""
        return Upkeep(self.redis, self.settings, self.scripts)

    def admit(
        self,
        job_id: str,
        spec: JobSpec,
        ttl_s: float,
        quota: int | None = None,
        doorbell: Doorbell | None = None,
        address: str | None = None,
        line: bool = False,
    ) -> Job:
        """Admit a job in fair order, or raise QueueFull / QuotaExceeded leaving nothing behind.

        `quota` is the owner's bound on waiting jobs (default: the server's per-user bound); `doorbell`, the
        job's dramatiq message, is enqueued in the same step. `address`, for a local-mode browser visitor: its
        client address, whose visitors share the quota, at most VISITORS_PER_ADDRESS of them with jobs waiting.
        A batch's `line` is admitted once only (a job of that id, admitted before, is returned as it stands),
        outside the owner's quota and listing: the batch bounds its own lines in the queue
        (web/openai/batches/runner.py).
        Returns the job as admitted, with its position and ETA, without reading it back.
        """
        return self.admit_all([(job_id, spec)], ttl_s, quota, doorbell, address, line)[0]

    def admit_all(
        self,
        jobs: list[tuple[str, JobSpec]],
        ttl_s: float,
        quota: int | None = None,
        doorbell: Doorbell | None = None,
        address: str | None = None,
        line: bool = False,
        param: str | None = None,
    ) -> list[Job]:
        """Admit a request's jobs (ids and specs: one per answer of `n`, alike but for their seed and place) as
        `admit` does one, in one step: all, or none and QueueFull / QuotaExceeded (StorageFull while Redis is full). More jobs than the bounds
        allow at all is InvalidRequest, naming `param` (the field that asked for them)."""
        s, n = self.settings, len(jobs)
        spec = jobs[0][1]
        self.memory.check()
        quota = 0 if line else quota or s.max_queued_per_user
        for bound, what in ((quota, "your quota allows {} waiting jobs"), (s.max_queue, "the queue holds {} jobs")):
            if n > 1 and 0 < bound < n:  # never admissible: no point in trying again later
                raise InvalidRequest(f"this request asks for {n} answers; {what.format(bound)}", param=param)
        with images.Uploads(self.redis, spec, ttl_s, s, param) as uploads:  # (dropped unless admitted)
            verdict, *rest = self.scripts.run(
                "admit",
                **self._spec_args(spec),
                ttl_s=ttl_s,
                result_ttl_s=s.result_ttl_s,
                max_queue=s.max_queue,
                max_per_user=quota,
                **bell(doorbell),
                prompt_weight=s.fair_prompt_weight,
                output_weight=s.fair_output_weight,
                visitors=keys.address_visitors(address) if address else "",
                max_visitors=VISITORS_PER_ADDRESS,
                line="1" if line else "",
                **uploads.send(),
                jobs=[part for job_id, one in jobs for part in (job_id, one.model_dump_json())],
            )
            uploads.admitted = verdict == "ok"
        if verdict == "exists":
            return [self.get(jobs[0][0])]
        if verdict in images.VERDICTS:
            raise images.refusal(verdict, rest, s, param)
        if verdict != "ok":
            self._refuse(verdict, rest, spec.model, n, quota)
        return self._queued(jobs, rest)

    def _queued(self, jobs: list[tuple[str, JobSpec]], admitted: list[Any]) -> list[Job]:
        """The jobs the admit script queued, as it answered: when they were queued, their deadline, and each one's
        place (its position and ETA, forecast from the snapshot of the queue the script took)."""
        queued_at, deadline, snapshot, *ranks = admitted
        standings = self._standings(snapshot, [int(rank) for rank in ranks])
        return [
            Job(
                id=job_id,
                spec=one,
                status=JobStatus.QUEUED,
                deadline=float(deadline),
                timings=Timings(queued_at=float(queued_at)),
                position=position,
                eta_s=eta_s,
            )
            for (job_id, one), (position, eta_s) in zip(jobs, standings)
        ]

    def _spec_args(self, spec: JobSpec) -> dict[str, Any]:
        """What the admit script reads of a request's spec: its owner, model, class and turn share, its answer's
        tokens (no further than its model's context), and its prompt: its chat's history so far (a digest: a worker
        whose prefix cache holds it may be preferred), its characters, those of its history, and its tokens if the
        web counted them."""
        s, history = self.settings, ""
        if spec.messages and len(spec.messages) > 1 and s.model_named(spec.model) is not None:
            history = history_digest(s.prefix_key(spec.model, spec.owner), spec.messages[:-1])
        texts = [spec.prompt] if spec.prompt is not None else [m.content for m in spec.messages or ()]
        if spec.pooled is not None:  # (token ids count as a character each)
            texts = [spec.pooled.query or "", *(t if isinstance(t, str) else " " * len(t) for t in spec.pooled.texts)]
        answer = spec.new_tokens
        if spec.prompt_tokens is not None and not spec.side:  # (its answer stops at the model's context)
            answer = window_of(s, spec.model).answer(spec.prompt_tokens, answer)
        sizes = [len(t) for t in texts]
        if (
            spec.prompt is None and spec.messages and spec.pooled is None
        ):  # an image counts as the tokens the vision tower gives it
            sizes = [n + IMAGE_CHARS * len(m.images) for n, m in zip(sizes, spec.messages, strict=True)]
        return {
            "owner": spec.owner,
            "watch_grace_s": s.watch_grace_s if spec.watched else 0,
            "max_tokens": answer,
            "model": spec.model,
            "class": spec.priority,
            "share": turn_share(s.user_named(spec.owner), spec.priority, s.batch_cost),
            "history": history,
            "side": "1" if spec.side else "",
            "ignore_eos": "1" if spec.params.ignore_eos else "",
            "prompt_chars": sum(sizes),
            "history_chars": sum(sizes[:-1]),
            "counted": spec.prompt_tokens or 0,
        }

    def _refuse(self, verdict: str, rest: list[Any], model: str, n: int, quota: int) -> NoReturn:
        """Admission's refusal, raised: the model is unavailable, or no room (room for all `n` jobs frees when the
        job at the position given starts)."""
        if verdict == "model_unavailable":
            raise ModelUnavailable(f"the model {model!r} is unavailable: {rest[1]}", retry_after_s=rest[0])
        position, snapshot, waiting = rest
        retry_after_s = max(1, math.ceil(self._standings(snapshot, [int(position)], guess=True)[0][1] or 0))
        kind, why = _refusal(verdict, n, int(waiting), quota, self.settings.max_queue)
        raise kind(f"{why}; try again later", retry_after_s=retry_after_s)

    def image(self, digest: str) -> bytes | None:
        """The bytes of the image kept under `digest`, if still kept (tasks/store/images.py)."""
        return self.redis.execute_command("GET", keys.image(digest), NEVER_DECODE=True)  # type: ignore[no-any-return]  # (execute_command's reply is Any: here bytes or None)

    def keep_watching(self, job: Job) -> None:
        """Renew a watched, waiting job's lease: its client (a stream, or polling) is still there."""
        if job.spec.watched and job.status is JobStatus.QUEUED:
            self.renew_watch(job.id)

    def renew_watch(self, job_id: str) -> None:
        """Renew the job's watch lease if it has one (a watched job that waits); harmless otherwise."""
        self.scripts.run("watch", id=job_id)

    def follow_live(self, job: Job) -> None:
        """A stream opened on `job`, which was admitted without one: from now on its tokens are written the moment
        they come (tasks/lua/live.lua)."""
        if not job.spec.stream and not job.status.ended:
            self.scripts.run("live", id=job.id)

    def get(self, job_id: str, owner: str | None = None) -> Job:
        """The job as it stands now, with its position while it waits. Another owner's job is not found."""
        for _ in range(3):
            pipe = self.redis.pipeline(transaction=False)
            pipe.hgetall(keys.job(job_id))
            pipe.get(keys.output(job_id))
            pipe.get(keys.logprobs(job_id))
            fields, output, logprobs = pipe.execute()
            if not fields or (owner is not None and fields.get("owner") != owner):
                raise JobNotFound(f"no job {job_id!r}", param="id")
            job = Job.from_redis(job_id, fields, output or "", logprobs or "")
            if job.status is not JobStatus.QUEUED:
                return job
            standing = self.standing(job)
            if standing.position is not None:
                return job.model_copy(update={"position": standing.position, "eta_s": standing.eta_s})
            # it left the queue between the two reads (it started, or ended): read it again
        return job

    def statuses(self, job_ids: list[str]) -> dict[str, JobStatus | None]:
        """Each job's status, in one round trip (None: no longer on record)."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(keys.job(job_id), "status")
        return {job_id: JobStatus(s) if s else None for job_id, s in zip(job_ids, pipe.execute())}

    def read(self, job_ids: list[str]) -> dict[str, Job]:
        """The jobs of those ids still on record, as they stand, in one round trip (no position read)."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hgetall(keys.job(job_id))
            pipe.get(keys.output(job_id))
            pipe.get(keys.logprobs(job_id))
        replies = pipe.execute()
        return {
            job_id: Job.from_redis(job_id, fields, output or "", logprobs or "")
            for job_id, fields, output, logprobs in zip(job_ids, replies[::3], replies[1::3], replies[2::3])
            if fields
        }

    def list(self, owner: str, limit: int = 50) -> list[Job]:
        """The owner's most recent jobs, newest first."""
        # (decode_responses: str replies)
        ids = cast(list[str], self.redis.zrevrange(keys.user_jobs(owner), 0, limit - 1))
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
            found = self.scripts.run(
                "cancel", id=job_id, owner=owner, result_ttl_s=self.settings.result_ttl_s, error=err
            )
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
        """Position and ETA of a waiting job: 1 + the jobs that start before it, and when it should start."""
        return self.standings([job.id])[0]

    def standings(self, job_ids: builtins.list[str]) -> builtins.list[Standing]:
        """The standing of each job, in one call (Standing(None, None) for a job that does not wait)."""
        snapshot, *ranks = self.scripts.run("position", limit=eta.LIMIT, ids=job_ids)
        standings = iter(self._standings(snapshot, [int(rank) for rank in ranks if rank]))
        return [Standing(*next(standings)) if rank else Standing(None, None) for rank in ranks]

    def _standings(
        self, snapshot: str, ranks: builtins.list[int], guess: bool = False
    ) -> builtins.list[tuple[int, float | None]]:
        """Where the jobs at `ranks` in the fair order stand, forecast from a snapshot a script took (tasks/eta.py):
        1 + the jobs that start before each (its rank, less the jobs ahead of it that it passes: eta.Plan.position),
        and when it should start; while no worker holds a device, its rank and no ETA (unless a `guess` will do: as
        if one took it now)."""
        s, taken = self.settings, eta.Snapshot.parse(snapshot)
        if not ranks or not (taken.devices or guess):
            return [(rank, None) for rank in ranks]
        rules = eta.Rules(
            s.max_batch, s.kv_budget_tokens, s.model_switch_wait_s, s.prefill_step * PREFILL_BATCH, s.preempt_limit
        )
        played = eta.plan(taken, rules)
        return [(played.position(rank), played.eta(rank)) for rank in ranks]

    def events(self, job_id: str, start: int = 0) -> builtins.list[Event]:
        """The job's durable events from index `start` on."""
        raw = cast(list[str], self.redis.lrange(keys.events(job_id), start, -1))  # (decode_responses: str replies)
        return [Event.decode(start + n, event) for n, event in enumerate(raw)]

    def ping(self) -> bool:
        return bool(self.redis.ping())


def _refusal(verdict: str, n: int, waiting: int, quota: int, max_queue: int) -> tuple[type[Overloaded], str]:
    """What admit.lua's refusal means, told truly for a request of `n` jobs: `waiting` count against the bound."""
    asks = f"this request asks for {n} answers"
    if verdict == "queue_full":
        if n == 1:
            return QueueFull, f"the queue is full ({max_queue} jobs waiting)"
        return QueueFull, f"the queue has room for {max(max_queue - waiting, 0)} more jobs, and {asks}"
    if verdict == "address_visitors":
        return QuotaExceeded, f"{VISITORS_PER_ADDRESS} other browsers at your address already have jobs waiting"
    whose = "you have" if verdict == "quota_exceeded" else "the browsers at your address have"
    if n == 1:
        return QuotaExceeded, f"{whose.replace('have', 'already have')} {quota} jobs waiting"
    return QuotaExceeded, f"{whose} {waiting} jobs waiting, and {asks}; the quota is {quota} waiting jobs"
