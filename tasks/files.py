"""Uploaded files (OpenAI's /v1/files, the Batch API's input): a record and the bytes, per owner, in Redis.

A file is the hash keys.file(id) (owner, purpose, filename, bytes, created_at, expires_at) and the string
keys.file_data(id), both written in one transaction with the TTL ONELANE_FILE_RETENTION, and listed in the owner's
sorted set keys.user_files(owner) (scored by the time it was made), whose ids older than any file lives are trimmed
at each upload (and which itself expires with the longest-lived file). A file that is deleted or expired leaves its
id there, its record gone: the listing skips it, and a client listing page by page while it deletes goes on from it.
A file is read only by its owner; another's is not found.
"""

from __future__ import annotations

import secrets
import time
from typing import cast

import redis
from pydantic import BaseModel, ConfigDict

from tasks import keys
from tasks.errors import FileNotFound, InvalidParameter
from tasks.settings import Settings
from tasks.store.memory import MemoryGuard


class FileRecord(BaseModel):
    """An uploaded file (web/openai/batches/answers.py FileObject.of: as OpenAI's `file` object shows it)."""

    model_config = ConfigDict(frozen=True)

    id: str
    owner: str
    purpose: str
    filename: str
    bytes: int
    created_at: int
    expires_at: int


LONGEST_KEEP_S = 2_592_000  # the longest any file lives (ONELANE_FILE_RETENTION's most, output_expires_after's)
READ_AT_ONCE = 100  # records read in one round trip while listing


def new_file_id() -> str:
    return "file-" + secrets.token_urlsafe(16)


class FileStore:
    def __init__(self, client: redis.Redis, settings: Settings, memory: MemoryGuard | None = None) -> None:
        self.redis, self.settings = client, settings
        self.memory = memory or MemoryGuard(client, settings.redis_memory_bytes)

    def create(
        self,
        owner: str,
        filename: str,
        purpose: str,
        data: bytes,
        file_id: str | None = None,
        keep_s: int | None = None,
    ) -> FileRecord:
        """Keep `data` as a new file (or as `file_id`, written again whole: a batch's result files), for `keep_s`
        seconds (a batch's output_expires_after) or ONELANE_FILE_RETENTION. A client's upload waits while Redis is
        full (StorageFull); a batch's result file, the end of work already admitted, does not."""
        if file_id is None:
            self.memory.check(len(data))
        now, keep = int(time.time()), keep_s or self.settings.file_retention_s
        record = FileRecord(
            id=file_id or new_file_id(),
            owner=owner,
            purpose=purpose,
            filename=filename,
            bytes=len(data),
            created_at=now,
            expires_at=now + keep,
        )
        fields = record.model_dump(exclude={"id"})
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(keys.file(record.id), mapping={k: str(v) for k, v in fields.items()})
        pipe.expire(keys.file(record.id), keep)
        pipe.set(keys.file_data(record.id), data, ex=keep)
        made = time.time()  # (finer than created_at: files made in one second list in the order made)
        pipe.zadd(keys.user_files(owner), {record.id: made})
        pipe.zremrangebyscore(keys.user_files(owner), "-inf", made - LONGEST_KEEP_S)
        pipe.expire(keys.user_files(owner), keep, gt=True)
        pipe.expire(keys.user_files(owner), keep, nx=True)
        pipe.execute()
        return record

    def get(self, file_id: str, owner: str) -> FileRecord:
        fields = cast(dict[str, str], self.redis.hgetall(keys.file(file_id)))  # (decode_responses: str replies)
        return _record(file_id, owner, fields)

    def content(self, file_id: str, owner: str) -> bytes:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.file(file_id))
        pipe.execute_command("GET", keys.file_data(file_id), NEVER_DECODE=True)
        fields, data = pipe.execute()
        _record(file_id, owner, fields)
        if data is None:  # (its two keys expire together; this is the moment between them)
            raise FileNotFound("no such file")
        return bytes(data)

    def delete(self, file_id: str, owner: str) -> None:
        self.get(file_id, owner)
        self.redis.delete(keys.file(file_id), keys.file_data(file_id))  # (its id stays listed: see above)

    def list(
        self,
        owner: str,
        limit: int,
        after: str | None = None,
        ascending: bool = False,
        purpose: str | None = None,
    ) -> tuple[list[FileRecord], bool]:
        """Up to `limit` of the owner's files, newest first (or oldest), from the one after `after`, of `purpose`
        only if given; and whether more follow. `after` must be one of the owner's files (InvalidParameter)."""
        key = keys.user_files(owner)
        # (decode_responses: str replies)
        ids = cast(list[str], self.redis.zrange(key, 0, -1) if ascending else self.redis.zrevrange(key, 0, -1))
        if after is not None:
            if after not in ids:
                raise InvalidParameter("after must be the id of one of your files", param="after")
            ids = ids[ids.index(after) + 1 :]
        found: list[FileRecord] = []
        for start in range(0, len(ids), READ_AT_ONCE):
            pipe = self.redis.pipeline(transaction=False)
            for file_id in ids[start : start + READ_AT_ONCE]:
                pipe.hgetall(keys.file(file_id))
            for file_id, fields in zip(ids[start : start + READ_AT_ONCE], pipe.execute()):
                if fields.get("owner") == owner and purpose in (None, fields.get("purpose")):
                    found.append(FileRecord.model_validate({"id": file_id, **fields}))
                if len(found) > limit:
                    return found[:limit], True
        return found, False


def _record(file_id: str, owner: str, fields: dict[str, str]) -> FileRecord:
    """The file whose hash is `fields`, if `owner`'s (FileNotFound otherwise, as when there is none)."""
    if not fields or fields.get("owner") != owner:
        raise FileNotFound("no such file")
    return FileRecord.model_validate({"id": file_id, **fields})
