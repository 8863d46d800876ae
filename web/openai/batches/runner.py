"""Runs the batches: admits their lines as the queue drains, collects what their jobs answered, writes their files.

Every web process runs one, on a thread of its own; a round of a batch holds its lock (tasks/batches.py), so several
processes share the work and any one of them can die at any point: the next round, in any process, goes on from
what Redis holds. A round runs when the queue moves (a job started or was admitted) and at least every INTERVAL_S.

A batch keeps at most ONELANE_BATCH_WAITING of its lines waiting in the queue, and the batches together at most
ONELANE_BATCH_SHARE of the live workers' slots in flight (waiting or running), so that an interactive job finds a free
slot rather than wait for a line to end. The lines are batch-class jobs (fair queuing puts one of them behind
ONELANE_BATCH_COST turns of each interactive user at most, and none ahead of an interactive job's turn), admitted
once only under ids made from the batch and the line, outside their owner's quota and listing. A full queue makes
the batch wait, never fail; a line whose model failed to load ends with that error. When every line has its result,
the batch writes its output and error files and ends; cancelled or past its window, it cancels what still runs,
keeps what completed, and ends each line not run with `batch_cancelled` or `batch_expired`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from typing import Any

import redis
from dramatiq.brokers.redis import RedisBroker
from flask import Flask, current_app

from tasks import keys
from tasks.background import Background
from tasks.batches import (
    STOPPING,
    BatchRecord,
    BatchStore,
    PendingLine,
    Result,
    job_id_of,
    request_id_of,
    result_file_id,
)
from tasks.broker import Doorbell
from tasks.errors import (
    BatchNotFound,
    InvalidRequest,
    JobAlreadyEnded,
    JobNotFound,
    ModelUnavailable,
    QueueFull,
    StorageFull,
)
from tasks.files import FileStore
from tasks.job import Job, JobSpec, JobStatus
from tasks.store import Store
from web.errors import job_error, openai_error
from web.openai.chat.body import ChatBody, CompletionBody
from web.openai.pooling.routes import embeddings_body
from web.openai.responses.body import snapshot
from web.services import Services

logger = logging.getLogger(__name__)

INTERVAL_S = 0.25  # a round at least this often: a line that ended is collected, and its place refilled, this soon
STOPPED = {"cancelled": "the batch was cancelled", "expired": "the batch's completion window ended"}
EXTENSION = "onelane_batch_runner"
# JSON lets these stand unescaped in a string, and str.splitlines() (a client's usual way to read JSONL) breaks a line
# at each: a result line holds none of them raw, so it stays one line however it is read
LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


class BatchRunner(Background):
    """Runs rounds of every batch not ended, on a thread of its own, until stopped."""

    name = "batches"

    def __init__(self, store: Store, batches: BatchStore, files: FileStore, broker: RedisBroker) -> None:
        super().__init__()
        self.store, self.batches, self.files, self.broker = store, batches, files, broker
        self.settings = store.settings

    def round(self) -> None:
        """A round of every batch not ended."""
        for batch_id in self.batches.active():
            self.run(batch_id)

    def run(self, batch_id: str) -> None:
        """A round of the batch now, unless another process runs one."""
        lock = self.batches.lock(batch_id)
        if not lock.acquire():
            return
        try:
            self._round(batch_id)
        finally:
            with contextlib.suppress(redis.exceptions.LockError):  # held past its timeout: another round may have run
                lock.release()

    def stop(self) -> None:
        """Stop at once: the loop waits on the queue's moves, so make one (a worker that hears it looks, finds
        nothing new, and waits again)."""
        self._stop.set()
        with contextlib.suppress(redis.RedisError):
            self.store.redis.publish(keys.QUEUE_MOVED, "")
        super().stop()

    def _loop(self) -> None:
        sub = None
        while not self._stop.is_set():
            try:
                if sub is None:
                    sub = self.store.redis.pubsub(ignore_subscribe_messages=True)
                    sub.subscribe(keys.QUEUE_MOVED)
                if sub.get_message(timeout=INTERVAL_S) is not None:
                    while sub.get_message(timeout=0) is not None:  # one round for every move so far
                        pass
                self.round()
            except redis.RedisError as exc:  # Redis away: try again in a while
                logger.warning("batch round failed: %s", exc)
                sub = None
                self._stop.wait(INTERVAL_S)
        if sub is not None:
            sub.close()

    def _round(self, batch_id: str) -> None:
        try:
            record = self.batches.get(batch_id)
        except BatchNotFound:  # past its retention
            self.batches.forget(batch_id)
            return
        if record.ended:
            self.batches.forget(batch_id)
            return
        stop = STOPPING.get(record.status) or ("expired" if time.time() >= record.expires_at else None)
        running = self.batches.running(batch_id)
        statuses = self.store.statuses(list(running))
        done = [job_id for job_id, status in statuses.items() if status is None or status.ended]
        jobs = self.store.read(done)  # (only those: a running line's output is not read every round)
        self.batches.collect(
            batch_id, [job_result(record, running[j], jobs.get(j), stop, self.settings.model_retry_s) for j in done]
        )
        if stop:
            for job_id in statuses.keys() - set(done):
                self._cancel(job_id, record.owner, stop)
        room = self.settings.batch_waiting - sum(status is JobStatus.QUEUED for status in statuses.values())
        fed = 0 if stop or room <= 0 else self._feed(record, min(room, self._share_left()))
        if len(done) == len(running) and not fed and (stop or self.batches.next_line(batch_id) is None):
            self._end(record, stop)

    def _share_left(self) -> int:
        """How many more lines the batches may have in flight: ONELANE_BATCH_SHARE of the live workers' slots (of
        ONELANE_MAX_BATCH while none is live), at least one, less what they have."""
        slots = self.store.readings.live_slots() or self.settings.max_batch
        return max(1, math.floor(slots * self.settings.batch_share)) - self.batches.in_flight()

    def _feed(self, record: BatchRecord, room: int) -> int:
        """Admit up to `room` more lines; how many were (or ended at once: a line whose model failed to load gets
        that error, as the model's waiting jobs do; a full queue makes the batch wait, within its window)."""
        fed = 0
        while fed < room and (line := self.batches.next_line(record.id)) is not None:
            job_id = job_id_of(record.id, line.index)
            ttl_s = record.expires_at - time.time()  # a line waits no longer than its batch
            try:
                self.store.admit(
                    job_id,
                    JobSpec.model_validate_json(line.spec),
                    ttl_s,
                    doorbell=Doorbell.ring(self.broker, job_id),
                    line=True,
                )
            except (QueueFull, StorageFull):  # (the batch waits, within its window)
                break
            except ModelUnavailable as exc:
                self.batches.skipped(record.id, error_result(record.id, line, exc.type, exc.message))
            else:
                self.batches.admitted(record.id, line)
            fed += 1
        return fed

    def _cancel(self, job_id: str, owner: str, stop: str) -> None:
        with contextlib.suppress(JobAlreadyEnded, JobNotFound):  # it ended meanwhile: the next round collects it
            self.store.cancel(job_id, owner, error=(f"batch_{stop}", STOPPED[stop]))

    def _end(self, record: BatchRecord, stop: str | None) -> None:
        """Every line has its result (or the batch stopped): write the files, end the batch."""
        bid = record.id
        if stop is None:
            self.batches.set_status(bid, "finalizing")
        else:
            code = f"batch_{stop}"
            left = [error_result(bid, line, code, STOPPED[stop]) for line in self.batches.remaining(bid)]
            self.batches.drop_remaining(bid, left)
        output, errors = self.batches.results(bid)
        self.batches.finish(
            bid,
            stop or "completed",
            self._file(record, "output", output),
            self._file(record, "error", errors),
            len(output),
            len(errors),
            record.output_keep_s,
        )
        logger.info("batch %s %s: %d completed, %d failed", bid, stop or "completed", len(output), len(errors))

    def _file(self, record: BatchRecord, kind: str, lines: list[str]) -> str | None:
        if not lines:
            return None
        data = "".join(line + "\n" for line in lines).encode()
        name = f"{record.id}_{kind}.jsonl"
        file_id = result_file_id(record.id, kind)
        return self.files.create(record.owner, name, "batch_output", data, file_id, record.output_keep_s).id


def start(app: Flask, svc: Services) -> BatchRunner:
    """Start the app's batch runner, stopped with its services."""
    runner = svc.keep(BatchRunner(svc.store, svc.batches, svc.files, svc.broker).start())
    app.extensions[EXTENSION] = runner
    return runner


def batch_runner() -> BatchRunner:
    """The current app's batch runner."""
    return current_app.extensions[EXTENSION]  # type: ignore[no-any-return]  # (Flask's extensions hold Any)


# --- result lines -------------------------------------------------------------------------------------------------


def job_result(
    record: BatchRecord, line: PendingLine, job: Job | None, stop: str | None, model_retry_s: float
) -> Result:
    """A line's result from its ended job: the endpoint's answer (output file), or why there is none (error file)."""
    bid, job_id = record.id, job_id_of(record.id, line.index)
    if job is None:  # its record is gone (it ended longer ago than its results are kept)
        return error_result(bid, line, "batch_expired", "the line's job is no longer on record", job_id)
    if job.status is JobStatus.COMPLETED:
        return _response(bid, line, job, 200, body_of(job, record.endpoint), ok=True)
    if job.status is JobStatus.FAILED:
        refused = job_error(job, model_retry_s)
        if isinstance(refused, InvalidRequest):  # the worker found the request invalid (a logit_bias's token id)
            return _response(bid, line, job, 400, {"error": openai_error(refused)}, ok=False)
        error = job.error.model_dump() if job.error else {"type": "job_failed", "message": "the job failed"}
        body = {"error": {"message": error["message"], "type": "server_error", "param": None, "code": error["type"]}}
        return _response(bid, line, job, 500, body, ok=False)
    if job.status is JobStatus.EXPIRED:
        return error_result(bid, line, "batch_expired", STOPPED["expired"], job_id)
    if stop is not None:
        return error_result(bid, line, f"batch_{stop}", STOPPED[stop], job_id)
    return error_result(bid, line, "cancelled", job.error.message if job.error else "the job was cancelled", job_id)


def body_of(job: Job, endpoint: str) -> dict[str, Any]:
    """The answer the endpoint gives for a completed job."""
    if endpoint == "/v1/responses":
        return snapshot(job)
    if endpoint == "/v1/embeddings":
        return embeddings_body(job)
    return (ChatBody if endpoint == "/v1/chat/completions" else CompletionBody)(job).body(job)


def error_result(batch_id: str, line: PendingLine, code: str, message: str, job_id: str | None = None) -> Result:
    """A line without an answer (not run, or refused before it was), for the error file."""
    return _line(batch_id, line.index, line.custom_id, None, {"code": code, "message": message}, False, job_id)


def refused_line(batch_id: str, index: int, custom_id: str | None, code: str, message: str) -> Result:
    """A line the endpoint refused as it was read (web/openai/batches/input.py's LineError)."""
    return _line(batch_id, index, custom_id, None, {"code": code, "message": message, "line": index + 1}, False, None)


def _response(bid: str, line: PendingLine, job: Job, status: int, body: dict[str, Any], ok: bool) -> Result:
    response = {"status_code": status, "request_id": job.id, "body": body}
    return _line(bid, line.index, line.custom_id, response, None, ok, job.id)


def _line(
    batch_id: str,
    index: int,
    custom_id: str | None,
    response: dict[str, Any] | None,
    error: dict[str, Any] | None,
    ok: bool,
    job_id: str | None,
) -> Result:
    body = {"id": request_id_of(batch_id, index), "custom_id": custom_id, "response": response, "error": error}
    return Result(index, json.dumps(body, ensure_ascii=False).translate(LINE_BREAKS), ok, job_id)
