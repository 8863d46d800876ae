"""Batches (OpenAI's Batch API) in Redis: a record, the lines still to admit, the lines running, their results.

A line moves from keys.batch_lines (JSON: its index, custom_id and job spec, in file order) to keys.batch_running
(job id -> the line) when its job is admitted, and from there to keys.batch_output or keys.batch_errors (line index
-> result line) once its job ended: each move is one transaction, a line's job id is a function of the batch and the
line (`job_id_of`), and the job is admitted once only (Store.admit's `line`). A runner that dies between two moves
leaves its successor nothing to do twice: every line ends in exactly one result. The runner is
web/openai/batches/runner.py.

Every key lives the batch's completion window plus ONELANE_FILE_RETENTION; at the end the lines and results go (the
results into the batch's files) and the record lives as long as its files.
"""

from __future__ import annotations

import builtins
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal, cast

import redis
from pydantic import BaseModel, ConfigDict

from tasks import keys
from tasks.endpoints import Endpoint
from tasks.errors import BatchNotFound
from tasks.settings import Settings
from tasks.store.memory import MemoryGuard

Status = Literal["validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled"]
ENDED = ("completed", "failed", "expired", "cancelled")
STOPPING = {"cancelling": "cancelled"}  # a status on its way to an end, and that end
LOCK_S = 10  # a round holds its batch at most this long (it takes milliseconds; a dead holder delays it so long)


class BatchRecord(BaseModel):
    """A batch, with its request counts (live while it runs; web/openai/batches/answers.py Batch.of: as OpenAI's `batch`
    object shows it)."""

    model_config = ConfigDict(frozen=True)

    id: str
    owner: str
    endpoint: Endpoint
    input_file_id: str
    completion_window: str = "24h"
    status: Status
    created_at: int
    expires_at: int
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    metadata: dict[str, str] | None = None
    errors: list[dict[str, Any]] | None = None
    output_keep_s: int | None = None  # its result files' life (output_expires_after); None: ONELANE_FILE_RETENTION

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    def fields(self) -> dict[str, str]:
        """The record as its Redis hash holds it (None left out; metadata and errors as JSON)."""
        out = {}
        for name, value in self.model_dump(exclude={"id"}).items():
            if value is not None:
                out[name] = json.dumps(value) if name in ("metadata", "errors") else str(value)
        return out

    @classmethod
    def from_redis(cls, batch_id: str, fields: dict[str, str]) -> BatchRecord:
        decoded: dict[str, Any] = dict(fields)
        for name in ("metadata", "errors"):
            if name in decoded:
                decoded[name] = json.loads(decoded[name])
        return cls.model_validate({"id": batch_id, **decoded})


@dataclass(frozen=True)
class PendingLine:
    """A line waiting for its job: its place in the file, its custom_id, and the job (JobSpec JSON)."""

    index: int
    custom_id: str
    spec: str

    def encode(self) -> str:
        return json.dumps({"i": self.index, "c": self.custom_id, "s": self.spec})

    @classmethod
    def decode(cls, raw: str) -> PendingLine:
        item = json.loads(raw)
        return cls(item["i"], item["c"], item.get("s", ""))


@dataclass(frozen=True)
class Result:
    """A line's result line (`ok`: for the output file; else the error file), and the job it came from, if any."""

    index: int
    line: str
    ok: bool
    job_id: str | None = None


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(12)


def job_id_of(batch_id: str, index: int) -> str:
    """The id of the job a batch's line is: the same whoever admits it, so it is admitted once only."""
    return f"job_{batch_id.removeprefix('batch_')}-{index}"


def request_id_of(batch_id: str, index: int) -> str:
    """The `id` of a line's result line."""
    return f"batch_req_{batch_id.removeprefix('batch_')}-{index}"


def result_file_id(batch_id: str, kind: str) -> str:
    """The id of the batch's output or error file: written again whole, not twice, if its end is run again."""
    return f"file-{batch_id.removeprefix('batch_')}-{kind}"


class BatchStore:
    """Verbs on batches: the web's (create, read, list, cancel) and the runner's (feed, collect, end)."""

    def __init__(self, client: redis.Redis, settings: Settings, memory: MemoryGuard | None = None) -> None:
        self.redis, self.settings = client, settings
        self.memory = memory or MemoryGuard(client, settings.redis_memory_bytes)

    # --- the web's verbs ------------------------------------------------------------------------------------------

    def create(self, record: BatchRecord, lines: list[PendingLine], errors: list[Result]) -> None:
        """Keep a new batch with its lines to run and the lines already failed (it runs unless it ended); StorageFull
        while Redis is full."""
        self.memory.check()
        life = max(1, record.expires_at - int(time.time())) + self.settings.file_retention_s
        bid = record.id
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(keys.batch(bid), mapping=record.fields())  # type: ignore[arg-type]  # (redis-py wants Mapping[EncodableT, ...], invariant in its key)
        for start in range(0, len(lines), 1000):
            pipe.rpush(keys.batch_lines(bid), *(line.encode() for line in lines[start : start + 1000]))
        if errors:
            pipe.hset(keys.batch_errors(bid), mapping={str(r.index): r.line for r in errors})
        now = time.time()  # (finer than created_at: batches made in one second list in the order made)
        pipe.zadd(keys.user_batches(record.owner), {bid: now})
        pipe.zremrangebyscore(keys.user_batches(record.owner), "-inf", now - life)
        if not record.ended:
            pipe.zadd(keys.BATCHES, {bid: now})
        for key in (keys.batch(bid), keys.batch_lines(bid), keys.batch_errors(bid), keys.user_batches(record.owner)):
            pipe.expire(key, life)
        self._extend(pipe, keys.BATCHES, life)
        pipe.execute()

    def get(self, batch_id: str, owner: str | None = None) -> BatchRecord:
        """The batch as it stands, with live counts while it runs. Another owner's is not found."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.batch(batch_id))
        pipe.hlen(keys.batch_output(batch_id))
        pipe.hlen(keys.batch_errors(batch_id))
        fields, completed, failed = pipe.execute()
        if not fields or (owner is not None and fields.get("owner") != owner):
            raise BatchNotFound("no such batch", param="batch_id")
        record = BatchRecord.from_redis(batch_id, fields)
        if record.ended:
            return record
        return record.model_copy(update={"completed": completed, "failed": failed})

    def list(self, owner: str, limit: int, after: str | None = None) -> tuple[list[BatchRecord], bool]:
        """The owner's batches, newest first, from the one after `after`; and whether more follow."""
        ids = cast(list[str], self.redis.zrevrange(keys.user_batches(owner), 0, -1))  # (decode_responses: str replies)
        if after is not None:
            ids = ids[ids.index(after) + 1 :] if after in ids else []
        records = []
        for batch_id in ids[:limit]:
            try:
                records.append(self.get(batch_id, owner))
            except BatchNotFound:  # past its retention
                continue
        return records, len(ids) > limit

    def cancel(self, batch_id: str, owner: str) -> BatchRecord:
        """Ask a running batch to stop (its runner cancels what runs and keeps what completed); harmless on a batch
        that is stopping or ended."""
        key = keys.batch(batch_id)
        with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    record = self.get(batch_id, owner)
                    if record.ended or record.status in STOPPING:
                        pipe.unwatch()
                        return record
                    pipe.multi()
                    pipe.hset(key, mapping={"status": "cancelling", "cancelling_at": str(int(time.time()))})
                    pipe.publish(keys.batch_channel(batch_id), "cancelling")
                    pipe.execute()
                    return self.get(batch_id, owner)
                except redis.WatchError:  # it changed meanwhile: read it again
                    continue

    def unended(self) -> builtins.list[BatchRecord]:
        """Every batch not ended, oldest first, whoever's (the dashboard's view: it shows only what one may see)."""
        out = []
        for batch_id in self.active():
            try:
                out.append(self.get(batch_id))
            except BatchNotFound:  # past its retention: the next round forgets it
                continue
        return out

    # --- the runner's verbs ---------------------------------------------------------------------------------------

    def active(self) -> builtins.list[str]:
        """The batches not ended, oldest first."""
        return list(cast(list[str], self.redis.zrange(keys.BATCHES, 0, -1)))  # (decode_responses: str replies)

    def lock(self, batch_id: str) -> Any:
        """A lock on the batch's round (redis-py's Lock: released only by its holder)."""
        return self.redis.lock(keys.batch_lock(batch_id), timeout=LOCK_S, blocking=False)

    def running(self, batch_id: str) -> dict[str, PendingLine]:
        """The batch's lines admitted and not collected yet, by job id."""
        # (decode_responses: str replies)
        running = cast(dict[str, str], self.redis.hgetall(keys.batch_running(batch_id)))
        return {job_id: PendingLine.decode(raw) for job_id, raw in running.items()}

    def in_flight(self) -> int:
        """Every batch's lines admitted and not collected yet (waiting, running, or just ended)."""
        pipe = self.redis.pipeline(transaction=False)
        for batch_id in self.active():
            pipe.hlen(keys.batch_running(batch_id))
        return sum(pipe.execute())

    def next_line(self, batch_id: str) -> PendingLine | None:
        """The first line not admitted yet (it stays first until `admitted`)."""
        raw = cast(str | None, self.redis.lindex(keys.batch_lines(batch_id), 0))  # (decode_responses: str replies)
        return PendingLine.decode(raw) if raw is not None else None

    def admitted(self, batch_id: str, line: PendingLine) -> None:
        """The first line's job is admitted: move the line to the running ones."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.lpop(keys.batch_lines(batch_id))
        pipe.hset(keys.batch_running(batch_id), job_id_of(batch_id, line.index), line.encode())
        pipe.expire(keys.batch_running(batch_id), self._life(batch_id))
        pipe.execute()

    def skipped(self, batch_id: str, result: Result) -> None:
        """The first line cannot be admitted: it ends with `result`."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.lpop(keys.batch_lines(batch_id))
        self._keep(pipe, batch_id, [result])
        pipe.execute()

    def collect(self, batch_id: str, results: builtins.list[Result]) -> None:
        """Lines whose jobs ended: their results kept (a line's first result only), the lines no longer running."""
        if not results:
            return
        pipe = self.redis.pipeline(transaction=True)
        self._keep(pipe, batch_id, results)
        pipe.hdel(keys.batch_running(batch_id), *(r.job_id for r in results if r.job_id))
        pipe.publish(keys.batch_channel(batch_id), "collected")
        pipe.execute()

    def remaining(self, batch_id: str) -> builtins.list[PendingLine]:
        """Every line not admitted yet."""
        lines = cast(list[str], self.redis.lrange(keys.batch_lines(batch_id), 0, -1))  # (decode_responses: str replies)
        return [PendingLine.decode(raw) for raw in lines]

    def drop_remaining(self, batch_id: str, results: builtins.list[Result]) -> None:
        """The lines never admitted end with `results` (a stopped batch's)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(keys.batch_lines(batch_id))
        self._keep(pipe, batch_id, results)
        pipe.execute()

    def results(self, batch_id: str) -> tuple[builtins.list[str], builtins.list[str]]:
        """The output and error lines, each in file order."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.batch_output(batch_id))
        pipe.hgetall(keys.batch_errors(batch_id))
        output, errors = ([lines[k] for k in sorted(lines, key=int)] for lines in pipe.execute())
        return output, errors

    def set_status(self, batch_id: str, status: str) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(keys.batch(batch_id), mapping={"status": status, f"{status}_at": str(int(time.time()))})
        pipe.publish(keys.batch_channel(batch_id), status)
        pipe.execute()

    def finish(
        self,
        batch_id: str,
        status: str,
        output_file_id: str | None,
        error_file_id: str | None,
        completed: int,
        failed: int,
        keep_s: int | None = None,
    ) -> None:
        """The batch ended: its record final, its lines and results gone (they are in its files), off the runners'
        list. The record lives as long as its files, and at least ONELANE_FILE_RETENTION."""
        fields = {
            "status": status,
            f"{status}_at": str(int(time.time())),
            "completed": str(completed),
            "failed": str(failed),
        }
        fields.update({k: v for k, v in (("output_file_id", output_file_id), ("error_file_id", error_file_id)) if v})
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(keys.batch(batch_id), mapping=fields)  # type: ignore[arg-type]  # (redis-py wants Mapping[EncodableT, ...], invariant in its key)
        pipe.expire(keys.batch(batch_id), max(self.settings.file_retention_s, keep_s or 0))
        pipe.delete(
            *(k(batch_id) for k in (keys.batch_lines, keys.batch_running, keys.batch_output, keys.batch_errors))
        )
        pipe.zrem(keys.BATCHES, batch_id)
        pipe.publish(keys.batch_channel(batch_id), status)
        pipe.execute()

    def forget(self, batch_id: str) -> None:
        """Off the runners' list (a batch whose record is gone)."""
        self.redis.zrem(keys.BATCHES, batch_id)

    def _keep(self, pipe: Any, batch_id: str, results: builtins.list[Result]) -> None:
        life = self._life(batch_id)
        for r in results:
            key = keys.batch_output(batch_id) if r.ok else keys.batch_errors(batch_id)
            pipe.hsetnx(key, str(r.index), r.line)
        for key in (keys.batch_output(batch_id), keys.batch_errors(batch_id)):
            pipe.expire(key, life)

    def _life(self, batch_id: str) -> int:
        """What is left of the batch's record's life (its other keys live as long)."""
        return max(1, int(self.redis.ttl(keys.batch(batch_id))))

    @staticmethod
    def _extend(pipe: Any, key: str, life: int) -> None:
        pipe.expire(key, life, gt=True)
        pipe.expire(key, life, nx=True)
