"""Uploaded files (OpenAI's /v1/files, the Batch API's input): a record and the bytes, per owner, in Redis.

A file is the hash keys.file(id) (owner, purpose, filename, bytes, created_at, expires_at) and the string
keys.file_data(id), both written in one transaction with the TTL ONELANE_FILE_RETENTION, and listed in the owner's
sorted set keys.user_files(owner), whose ids past their retention are trimmed at each upload (and which itself
expires with the newest file). A file is read only by its owner; another's is not found.
"""

from __future__ import annotations

import secrets
import time

import redis
from pydantic import BaseModel, ConfigDict

from tasks import keys
from tasks.errors import FileNotFound
from tasks.settings import Settings


class FileRecord(BaseModel):
    """An uploaded file (web/responses.py FileObject.of: as OpenAI's `file` object shows it)."""

    model_config = ConfigDict(frozen=True)

    id: str
    owner: str
    purpose: str
    filename: str
    bytes: int
    created_at: int
    expires_at: int


def new_file_id() -> str:
    return "file-" + secrets.token_urlsafe(16)


class FileStore:
    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.redis, self.settings = client, settings

    def create(self, owner: str, filename: str, purpose: str, data: bytes, file_id: str | None = None) -> FileRecord:
        """Keep `data` as a new file (or as `file_id`, written again whole: a batch's result files)."""
        now, keep = int(time.time()), self.settings.file_retention_s
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
        pipe.zadd(keys.user_files(owner), {record.id: now})
        pipe.zremrangebyscore(keys.user_files(owner), "-inf", now - keep)
        pipe.expire(keys.user_files(owner), keep)
        pipe.execute()
        return record

    def get(self, file_id: str, owner: str) -> FileRecord:
        return _record(file_id, owner, self.redis.hgetall(keys.file(file_id)))

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
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(keys.file(file_id), keys.file_data(file_id))
        pipe.zrem(keys.user_files(owner), file_id)
        pipe.execute()

    def list(self, owner: str, limit: int) -> list[FileRecord]:
        """The owner's files, newest first (those past their retention are gone)."""
        ids = self.redis.zrevrange(keys.user_files(owner), 0, limit - 1)
        pipe = self.redis.pipeline(transaction=False)
        for file_id in ids:
            pipe.hgetall(keys.file(file_id))
        return [
            FileRecord.model_validate({"id": file_id, **fields})
            for file_id, fields in zip(ids, pipe.execute())
            if fields.get("owner") == owner
        ]


def _record(file_id: str, owner: str, fields: dict[str, str]) -> FileRecord:
    """The file whose hash is `fields`, if `owner`'s (FileNotFound otherwise, as when there is none)."""
    if not fields or fields.get("owner") != owner:
        raise FileNotFound("no such file")
    return FileRecord.model_validate({"id": file_id, **fields})
