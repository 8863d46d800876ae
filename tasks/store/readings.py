"""What the store reads for health checks, /metrics and the dashboard: the workers, the models, the queue, the
last hour. Only reads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import redis

from tasks import keys
from tasks.job import Job
from tasks.settings import Settings

BOARD_WAITING = 500  # waiting jobs the dashboard reads one by one, in queue order; it only counts the rest


BOARD_MINUTES = 60  # the dashboard plots the last hour


@dataclass(frozen=True, kw_only=True)
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

    @classmethod
    def parse(cls, device: str, lease: dict[str, str], jobs: tuple[str, ...], now: float) -> DeviceLease:
        """The live worker of `device` from its lease's hash (lease.lua writes it), running `jobs`; its ages
        are measured to `now`, Redis's clock."""
        progress = float(lease.get("progress") or lease["since"])
        return cls(
            device=device,
            worker=lease["worker"],
            pid=int(lease.get("pid", 0)),
            heartbeat_age_s=now - float(lease["beat"]),
            jobs=jobs,
            progress_age_s=now - progress if jobs else None,
            batch=int(lease.get("batch", 0)),
            slots=int(lease.get("slots", 0)),
            tokens_per_s=float(lease.get("tok_s", 0)),
            models=tuple(filter(None, lease.get("models", "").split(","))),
            active=lease.get("active", ""),
            loading=lease.get("loading", ""),
            cache_bytes=int(lease.get("cache_bytes", 0)),
            cache_entries=int(lease.get("cache_entries", 0)),
        )


@dataclass(frozen=True)
class ModelState:
    """A served model as the workers report it: `loaded`, `loading` (for `loading_s` so far), `failed` (from its
    failed load until a load replaces it; tried again in `retry_in_s`, 0 once due) or `unloaded`."""

    name: str
    state: str
    queue_depth: int
    load_s: float | None = None  # how long its last load took
    bytes: int | None = None  # its weights' size once loaded
    error: str | None = None  # why it failed to load (while it loads again too)
    retry_in_s: float | None = None  # when a failed model is tried again
    batching: str | None = None  # `batched` or `alone` (one sequence at a time), as its last load found; None before
    token_cost: float | None = (
        None  # a generated token's cost in prompt tokens read, as measured (lease.lua); None before
    )
    loading_s: float | None = None  # how long its load has run, while it loads (None: not known)


@dataclass(frozen=True, kw_only=True)
class Reading:
    now: float
    queue_depth: int
    in_progress: int
    stats: dict[str, str]
    workers: list[DeviceLease]
    models: list[ModelState]
    devices: tuple[str, ...] = ()  # every device seen, with a live worker or not
    service: tuple[tuple[str, float], ...] = ()  # each flow's service: token units its ended jobs used (keys.SERVICE)


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
        return cls(
            index * 60.0,
            int(n.get("admitted", 0)),
            ended,
            int(n.get("tokens", 0)),
            int(n.get("started", 0)),
            n.get("wait_sum", 0.0),
            n.get("wait_max", 0.0),
        )


@dataclass(frozen=True, kw_only=True)
class BoardEntry:
    """A waiting job on the dashboard: its owner and place, and the job itself only where it may be shown."""

    id: str
    owner: str
    position: int
    job: Job | None


@dataclass(frozen=True)
class Board:
    """The queue as the dashboard shows it."""

    snapshot: Reading
    running: list[Job]  # by start
    waiting: list[BoardEntry]  # the first BOARD_WAITING in queue order; snapshot.queue_depth counts them all
    failures: list[Job]  # failed or expired, newest first
    minutes: list[Minute]  # the last BOARD_MINUTES, oldest first, the current one last


class Readings:
    """Reads on `store`'s connection."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.redis, self.settings = client, settings

    def snapshot(self) -> Reading:
        """Everything /readyz and /metrics report, read in two pipelines."""
        devices = sorted(cast(set[str], self.redis.smembers(keys.DEVICES)))  # (decode_responses: str replies)
        catalog = [m.name for m in self.settings.catalog]
        pipe = self.redis.pipeline(transaction=False)
        pipe.time()
        pipe.zcard(keys.QUEUE)
        pipe.zrange(keys.IN_PROGRESS, 0, -1)
        pipe.hgetall(keys.STATS)
        pipe.zrange(keys.SERVICE, 0, -1, withscores=True)
        for name in catalog:
            pipe.zcard(keys.model_queue(name))
            pipe.hgetall(keys.model(name))
        for name in devices:
            pipe.hgetall(keys.device(name))
        now_parts, depth, running, stats, service, *rest = pipe.execute()
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
            workers.append(DeviceLease.parse(name, lease, jobs, now))
        models = [
            _model_state(name, int(n), record, workers, now)
            for name, n, record in zip(catalog, per_model[::2], per_model[1::2])
        ]
        return Reading(
            now=now,
            queue_depth=int(depth),
            in_progress=len(running),
            stats=stats,
            workers=workers,
            models=models,
            devices=tuple(devices),
            service=tuple(service),
        )

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
        queue = [
            BoardEntry(id=job_id, owner=owner, position=n, job=jobs.get(job_id))
            for n, (job_id, owner) in enumerate(zip(waiting, owners), 1)
            if owner
        ]
        return Board(
            snap,
            [jobs[i] for i in running if i in jobs],
            queue,
            [jobs[i] for i in failed if i in jobs],
            [Minute.parse(first + n, fields) for n, fields in enumerate(minutes)],
        )

    def _records(self, job_ids: list[str]) -> dict[str, Job]:
        """The jobs still on record among `job_ids`, without their output."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hgetall(keys.job(job_id))
        return {
            job_id: Job.from_redis(job_id, fields, "")
            for job_id, fields in zip(job_ids, pipe.execute())
            if fields.get("spec")
        }

    def live_slots(self) -> int:
        """The slots of every live worker's batch (its ONELANE_MAX_BATCH, as its lease reports it)."""
        devices = list(cast(set[str], self.redis.smembers(keys.DEVICES)))  # (decode_responses: str replies)
        pipe = self.redis.pipeline(transaction=False)
        for name in devices:
            pipe.hmget(keys.device(name), "worker", "slots")
        return sum(int(slots or 0) for worker, slots in pipe.execute() if worker)

    def batching(self, names: list[str]) -> dict[str, str | None]:
        """How each model's sequences share the batch, as its last load found (`batched`, `alone`; None before)."""
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.hget(keys.model(name), "batching")
        return {name: shared_as(found) for name, found in zip(names, pipe.execute())}

    def images(self, names: list[str]) -> dict[str, str | None]:
        """How each vision model's image prompts run, as its last load found (`batched`, `whole`, `alone`; None
        before, or for a text model)."""
        return self._loaded(names, "images")

    def speculation(self, names: list[str]) -> dict[str, str | None]:
        """How each model's sequences speculate, as its last load found (`prompt lookup`, or `off: why`; None
        before, or for a model that generates nothing)."""
        return self._loaded(names, "speculation")

    def _loaded(self, names: list[str], field: str) -> dict[str, str | None]:
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.hget(keys.model(name), field)
        return {name: found or None for name, found in zip(names, pipe.execute())}

    def waiting(self) -> int:
        """How many jobs wait."""
        return int(self.redis.zcard(keys.WAITING))


def _model_state(name: str, depth: int, record: dict[str, str], workers: list[DeviceLease], now: float) -> ModelState:
    """A model's state: what live workers report (loaded, loading: a live worker's report, or the record of a load
    a live worker began) comes first; a failure holds until a load replaces it (its retry may be due: nothing asked
    for the model since, and nothing says it would load now)."""
    retry_at = float(record.get("retry_at") or 0)
    began = record.get("state") == "loading" and any(w.worker == record.get("worker") for w in workers)
    if any(name in w.models for w in workers):
        state = "loaded"
    elif began or any(w.loading == name for w in workers):
        state = "loading"
    elif record.get("state") == "failed":
        state = "failed"
    else:
        state = "unloaded"
    loading_at = float(record.get("loading_at") or 0) if record.get("state") == "loading" else 0.0
    return ModelState(
        name,
        state,
        depth,
        float(record["load_s"]) if record.get("load_s") else None,
        int(record["bytes"]) if record.get("bytes") else None,
        record.get("error") or None if state in ("failed", "loading") else None,  # (loading: a retry's)
        round(max(retry_at - now, 0.0), 3) if state == "failed" else None,
        shared_as(record.get("batching")),
        float(record["token_cost"]) if record.get("token_cost") else None,
        round(max(now - loading_at, 0.0), 3) if state == "loading" and loading_at else None,
    )


def shared_as(batching: str | None) -> str | None:
    """What users are told of a model's batching (worker/batch/prefill.py's: `padded` and `unpadded` both batch)."""
    return None if not batching else "alone" if batching == "alone" else "batched"
