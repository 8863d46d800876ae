"""The worker's verbs on jobs and its device: bound to one worker process (its id) once, for its life.

Its lease on the device (lease.lua), the jobs it claims (claim.lua), the text it writes (append.lua), how they end
(finish.lua, recover.lua), and what it tells of its models. Only the worker holding the device's lease may claim,
write or end: a worker presumed dead (its jobs requeued) finds its writes refused.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import redis

from tasks import keys
from tasks.errors import LeaseLost
from tasks.job import Job, JobStatus, error_json
from tasks.scripts import ARGS, Scripts
from tasks.settings import Settings
from tasks.store.upkeep import Upkeep


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
    cache_disk_hits: int = 0  # ... of those, read from its disk tier
    cache_disk_tokens: int = 0
    cache_bytes: int = 0  # ... and what it holds now
    cache_entries: int = 0
    pace: str = "{}"  # JSON: each model's measured speed here, [step s, s per sequence, s per prompt token]
    step_s: float = 0.0  # how long the step now on the device has run (0: none runs)
    step_limit_s: float = 0.0  # ... and how long it may (0: until ONELANE_STALL_S), worker/step_watch.py

    NAMES: ClassVar[tuple[str, ...]] = ARGS["lease"][5:]  # what lease.lua takes of a report, by name

    def fields(self) -> dict[str, object]:
        """The report as lease.lua takes it, by name."""
        told: dict[str, object] = {**asdict(self), "models": ",".join(self.models)}
        rate = told.pop("tokens_per_s")
        return {
            **told,
            "tok_s": f"{rate:.1f}",
            "decode_s": f"{self.decode_s:.6f}",
            "prefill_s": f"{self.prefill_s:.6f}",
        }


@dataclass(frozen=True)
class Delivered:
    """What a job's earlier runs generated (it was requeued): its next run goes on from there, never sampling them
    again. `text` is what was written of `ids`: a stop string's possible start, or a character's first bytes, are
    held back until the tokens after them tell."""

    ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class Claim:
    """What a claim found: the job it started for the worker, or the job at the head of the queue, unclaimed."""

    job: Job
    started: bool
    solo: bool  # the job must run alone (it was in a batch that failed: see release() in tasks/lua/common.lua)
    behind: int  # jobs waiting behind it (the worker need not look again for more while there are none)
    delivered: Delivered | None = None  # what its earlier runs generated, if it was requeued
    live: bool = False  # its client reads the answer as it is generated (JobSpec.stream, or Store.follow_live)


@dataclass(frozen=True)
class Switch:
    """The next job needs another model than the worker's batch runs (`load`: one the worker has not loaded), and
    no job of a model it has ready may go ahead of it any longer."""

    head: str
    model: str
    load: bool
    side: bool = False  # the head is a pooled job: its model loads beside the batch, which goes on


class WorkerStore:
    """The verbs of the worker process `worker` (its id), on `store`'s connection."""

    def __init__(self, client: redis.Redis, settings: Settings, scripts: Scripts, worker: str) -> None:
        self.redis, self.settings, self.scripts = client, settings, scripts
        self.upkeep = Upkeep(client, settings, scripts)  # (its counters)
        self.worker = worker
        self._claim_token = ""  # the claim sent and not yet answered, if any

    def images(self, digests: list[str]) -> dict[str, bytes]:
        """The bytes of the images kept under these digests (one no longer kept is left out)."""
        pipe = self.redis.pipeline(transaction=False)
        for digest in digests:
            pipe.execute_command("GET", keys.image(digest), NEVER_DECODE=True)
        return {d: data for d, data in zip(digests, pipe.execute()) if data is not None}

    def take_device(self, report: BatchReport | None = None) -> str:
        """Take this device's lease for this worker (or renew it): 'ok', or the id of the worker holding it."""
        return self._lease("take", report)

    def renew_device(self, report: BatchReport | None = None) -> str:
        """Renew the lease this worker holds: 'ok'; 'lapsed' if it lapsed (the worker must stop: its jobs may have been
        taken back); or the id of the worker that took it. A refused renewal records that this worker woke after its
        lease lapsed: a late heartbeat, which counts against none of its jobs (tasks/lua/housekeep.lua)."""
        return self._lease("renew", report)

    def _lease(self, mode: str, report: BatchReport | None) -> str:
        lease_ms = int(self.settings.lease_s * 1000)
        told = report.fields() if report else dict.fromkeys(BatchReport.NAMES, "")
        return str(
            self.scripts.run(
                "lease",
                device=self.settings.device,
                worker=self.worker,
                pid=os.getpid(),
                lease_ms=lease_ms,
                mode=mode,
                **told,
            )
        )

    def claim_next(
        self,
        want: str | None = None,
        active: str = "",
        loaded: tuple[str, ...] | None = None,
        urgent: bool = False,
    ) -> Claim | Switch | None:
        """Atomically start the next job for this worker if it is `want` (any job: "*"); else tell which job is next,
        unclaimed (the worker measures it, and names it when it fits). The next job is the fair order's head, or a
        job of the model the batch runs (`active`; '' for an empty batch) or of a `loaded` one, within the switch
        bound (see tasks/lua/claim.lua); past it, a Switch. None when nothing waits. `loaded` defaults to every
        model served (a worker that keeps them all). `urgent`: the batch has no room and holds batch-class work
        this worker may set aside: an interactive job of the batch's model goes ahead of a batch-class head.

        Raises LeaseLost if this worker no longer holds the device (it must stop: another worker took over).
        """
        s = self.settings
        run_life = int(s.job_time_limit_s + s.result_ttl_s)
        loaded = tuple(m.name for m in s.catalog) if loaded is None else loaded
        # a claim whose answer is lost is sent again with its token: a job it started is answered, not orphaned
        self._claim_token = self._claim_token or uuid.uuid4().hex
        claimed = self.scripts.run(
            "claim",
            result_ttl_s=s.result_ttl_s,
            run_life_s=run_life,
            device=s.device,
            worker=self.worker,
            token=self._claim_token,
            want=want or "",
            active=active,
            switch_wait_s=s.model_switch_wait_s,
            affinity_s=s.cache_affinity_s,
            urgent="1" if urgent else "",
            loaded=loaded,
        )
        self._claim_token = ""  # answered
        if claimed == "lost":
            self.renew_device()  # refused, as the claim was: it tells Redis this worker woke (it was late, not dead)
            raise LeaseLost(f"worker {self.worker} lost the lease of device {self.settings.device}")
        if not claimed:
            return None
        if claimed[0] in ("switch", "load"):
            return Switch(claimed[1], claimed[2], load=claimed[0] == "load", side=claimed[3:] == ["side"])
        verdict, job_id, flat, behind, ids, text = claimed
        fields = dict(zip(flat[::2], flat[1::2]))
        delivered = Delivered(tuple(int(i) for i in ids.split(",") if i), text) if ids else None
        job = Job.from_redis(job_id, fields, text)
        live = job.spec.stream or fields.get("live") == "1"
        return Claim(job, verdict == "started", fields.get("solo") == "1", int(behind), delivered, live)

    def model_retry_due(self, name: str) -> bool:
        """The model's last load failed, and the time to try it again has come."""
        state, retry_at = self.redis.hmget(keys.model(name), "state", "retry_at")
        sec, usec = self.redis.time()
        return bool(state == "failed" and float(retry_at or 0) <= sec + usec / 1e6)

    def load_error(self, name: str) -> str | None:
        """Why the model's last load failed, as recorded (None if none is)."""
        found = self.redis.hget(keys.model(name), "error")
        return str(found) if found else None

    def model_loading(self, name: str) -> None:
        """A load of the model begins on this worker, now (Redis's clock: ETAs and /readyz count from it)."""
        sec, usec = self.redis.time()
        self._model(name, state="loading", loading_at=f"{sec + usec / 1e6:.3f}")

    def model_loaded(
        self,
        name: str,
        load_s: float,
        size: int,
        batching: str = "padded",
        images: str | None = None,
        speculation: str = "",
    ) -> bool:
        """`batching`: how its sequences share the batch (worker/batch/prefill.py's Batching); `images`: how a vision
        model's image prompts run (worker/vision.py's `images`; None: a text model); `speculation`: how its
        sequences speculate (`prompt lookup`, `draft model NAME`, or `off` and why: worker/batch/speculation.py).
        False: this worker no longer holds the device (its lease lapsed as it loaded), and nothing was written."""
        return self._model(
            name,
            state="loaded",
            load_s=f"{load_s:.3f}",
            bytes=size,
            error="",
            deaths=0,
            lapsed="",
            batching=batching,
            images=images or "",
            speculation=speculation,
        )

    def model_unloaded(self, name: str) -> None:
        self._model(name, state="unloaded")

    def model_failed(self, name: str, message: str) -> int:
        """Record that `name` failed to load and fail its waiting jobs (model_unavailable); returns how many."""
        s = self.settings
        return int(
            self.scripts.run(
                "model_failed",
                model=name,
                message=message,
                retry_s=s.model_retry_s,
                result_ttl_s=s.result_ttl_s,
                worker=self.worker,
            )
        )

    def _model(self, name: str, **fields: object) -> bool:
        """Write the model's record as this worker's, if it holds the device (a late loader writes nothing:
        tasks/lua/model_state.lua); whether it did."""
        pairs = [str(part) for field in fields.items() for part in field]
        return bool(
            self.scripts.run("model_state", model=name, device=self.settings.device, worker=self.worker, fields=pairs)
        )

    def append(
        self,
        job_id: str,
        ids: tuple[int, ...],
        text: str,
        prompt_tokens: int,
        start: tuple[int, int] | None = None,
        cached_tokens: int = 0,
        logprobs: tuple[str, ...] = (),
        prompt_logprobs: str = "",
        pipe: Any = None,
    ) -> Any:
        """Record generated text, made of the tokens `ids`, as one token event (no ids and no text: progress without
        a token, as in a long prefill); true when the job must stop (cancelled, or taken away). The ids are kept
        for a run after a requeue to go on from (see Claim.delivered). `start`: the job's tokens and output bytes
        before this text, so that a retried write appends only what did not get there (None: at the end).
        `cached_tokens`: of the prompt's, those read from the prefix cache. `logprobs`: the tokens' entries, one per
        id (tasks/logprobs.py), when the job asked for them; `prompt_logprobs`: its prompt's (a run's first write)."""
        where = start if start is not None else ("", "")
        return self.scripts.run(
            "append",
            pipe,
            id=job_id,
            text=text,
            prompt_tokens=prompt_tokens,
            worker=self.worker,
            from_n=where[0],
            from_b=where[1],
            cached_tokens=cached_tokens,
            ids="".join(f"{i}," for i in ids),
            lp="".join(f"{e}\n" for e in logprobs),
            prompt_lp=prompt_logprobs,
        )

    def finish(
        self,
        job_id: str,
        status: JobStatus,
        *,
        finish_reason: str | None = None,
        error: tuple[str, ...] | None = None,  # (type, message[, the request field at fault])
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        stop_seen_at: int | None = None,
        cached_tokens: int = 0,
        history: str = "",
        stop_sequence: str = "",
        proposed_tokens: int = 0,
        accepted_tokens: int = 0,
        pipe: Any = None,
    ) -> Any:
        """End a job this worker runs; false if it was not running there (it has its one terminal state). `history`:
        when the worker's prefix cache kept the job's KV state, the digest of the conversation it holds
        (tasks/job.py history_digest), recorded against this device so that the chat's follow-up is steered here."""
        err = error_json(*error) if error else ""
        s = self.settings
        seen = "" if stop_seen_at is None else stop_seen_at
        return self.scripts.run(
            "finish",
            pipe,
            id=job_id,
            status=status.value,
            finish_reason=finish_reason or "",
            error=err,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            result_ttl_s=s.result_ttl_s,
            worker=self.worker,
            stop_seen_at=seen,
            cached_tokens=cached_tokens,
            history=history,
            stop_sequence=stop_sequence,
            proposed_tokens=proposed_tokens,
            accepted_tokens=accepted_tokens,
        )

    def hand_back(self, job_id: str, why: str = "worker_crashed", shared: bool = False, pipe: Any = None) -> Any:
        """Release a job this worker runs but cannot finish: requeued at the front, or failed after max_attempts.
        `why`: worker_crashed (it could not record the outcome), generation_error (its batch's step failed), or
        stopping (the worker shuts down in good order: the run does not count as an attempt). `shared`: the job
        ran with others, so the failure is not blamed on it (see release() in tasks/lua/common.lua). Returns
        [id, verdict], or [] if it does not run there."""
        s = self.settings
        return self.scripts.run(
            "recover",
            pipe,
            max_attempts=s.max_attempts,
            ttl_s=s.job_ttl_s,
            result_ttl_s=s.result_ttl_s,
            id=job_id,
            worker=self.worker,
            why=why,
            shared="1" if shared else "",
        )

    def release_device(self) -> bool:
        """Free this device if this worker (stopped in good order: nothing of it runs on the device) holds it."""
        return bool(
            self.scripts.run("drop_lease", device=self.settings.device, field="worker", value=self.worker, died=0)
        )

    def listen(self) -> Any:
        """A pub/sub subscribed to the ids of running jobs asked to stop, of running jobs a stream opened on, and to
        the queue's moves."""
        sub = self.redis.pubsub(ignore_subscribe_messages=True)
        sub.subscribe(keys.CANCELS, keys.LIVE, keys.QUEUE_MOVED)
        return sub
