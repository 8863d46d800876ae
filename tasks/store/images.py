"""The image bytes Redis keeps: what admission sends of a request's images, and what its refusals mean.

A job's images are kept by the admission script that admits it, in the same step (tasks/lua/admit.lua): their bytes
are uploaded just before it (keys.image_upload, living UPLOAD_TTL_S at most), which moves them in place if it
admits the job; a refusal drops them at once, so that a refused request leaves no byte behind. Each is kept under its digest (keys.image) for as long as its owner holds it
(tasks/lua/images.lua): while one of the owner's jobs holding it may wait and run (its TTL + ONELANE_JOB_TIME_LIMIT),
the worker reading it again if it must (a job handed back, a prefix cache that lost it), and after one completed,
ONELANE_IMAGE_KEEP more (within ONELANE_RESULT_TTL), for a follow-up that resends it from the server's record (the
page's continue, `previous_response_id`) and for the job's page. When a job ends otherwise, or the last hold lapses,
the image goes. One owner holds at most ONELANE_IMAGE_USER_BYTES of images (a request past it waits, 429, unless
images kept only for a follow-up can make room: the oldest go first), everyone at most ONELANE_IMAGE_TOTAL_BYTES
(503 past it); one request's images alone past the owner's bound are a 413.
"""

from __future__ import annotations

import contextlib
import math
import secrets
from typing import Any

import redis

from tasks import keys
from tasks.errors import InvalidRequest, OnelaneError, PromptTooLarge, QueueFull, QuotaExceeded
from tasks.job import JobSpec
from tasks.settings import Settings

VERDICTS = ("image_gone", "image_quota", "image_full")


class Uploads:
    """The bytes of a request's images on their way to its admission (its admit script's image arguments), for one
    store's connection."""

    def __init__(self, client: redis.Redis, spec: JobSpec, ttl_s: float, settings: Settings, param: str | None):
        self.client, self.settings = client, settings
        self.pictures: dict[str, bytes | None] = {}  # each image once: its bytes, None for one resent without them
        for message in spec.messages or ():
            for p in message.images:
                self.pictures.setdefault(p.digest, p.data)
        sent = sum(len(data) for data in self.pictures.values() if data)
        if sent > settings.image_user_bytes:
            raise PromptTooLarge(
                f"the request's images have {sent} bytes; this server keeps at most {settings.image_user_bytes} a "
                "user's (ONELANE_IMAGE_USER_BYTES)",
                param=param or "messages",
            )
        self.prefix = keys.image_upload(secrets.token_hex(8))
        self.ttl_s = ttl_s
        self.admitted = False  # (set once the admit script moved the uploads in place)

    def __enter__(self) -> Uploads:
        return self

    def __exit__(self, *_: object) -> None:
        if not self.admitted:
            with contextlib.suppress(redis.RedisError):  # (Redis away: the uploads lapse in UPLOAD_TTL_S)
                self.drop()

    def send(self) -> dict[str, Any]:
        """Upload the bytes; the admit script's image arguments."""
        sent = [(d, data) for d, data in self.pictures.items() if data]
        if sent:
            pipe = self.client.pipeline(transaction=False)
            for digest, data in sent:
                pipe.set(self.prefix + digest, data, ex=keys.UPLOAD_TTL_S)
            pipe.execute()
        s = self.settings
        return {
            "images": " ".join(f"{d}:{len(data) if data else 0}" for d, data in self.pictures.items()),
            "image_upload": self.prefix,
            "image_need_s": math.ceil(self.ttl_s + s.job_time_limit_s),
            "image_keep_s": min(s.image_keep_s, s.result_ttl_s),
            "max_user_image_bytes": s.image_user_bytes,
            "max_image_bytes": s.image_total_bytes,
        }

    def drop(self) -> None:
        """Drop what was uploaded (the request was refused)."""
        sent = [self.prefix + d for d, data in self.pictures.items() if data]
        if sent:
            self.client.delete(*sent)


def refusal(verdict: str, rest: list[Any], settings: Settings, param: str | None) -> OnelaneError:
    """What the admit script's image verdict (VERDICTS) tells the client."""
    if verdict == "image_gone":
        return InvalidRequest(
            "an image of the conversation is no longer kept (a completed job's images are kept "
            f"{settings.image_keep_s} s after it ends: ONELANE_IMAGE_KEEP): send the conversation again with its "
            "images",
            param=param or "messages",
        )
    retry_after_s, held = int(rest[0]), int(rest[1])
    if verdict == "image_quota":
        return QuotaExceeded(
            f"your jobs' images hold {held} bytes; this server keeps at most {settings.image_user_bytes} a user's "
            "(ONELANE_IMAGE_USER_BYTES): try again when your jobs with images end",
            retry_after_s=retry_after_s,
        )
    return QueueFull(
        f"the server keeps {held} bytes of images, at most {settings.image_total_bytes} "
        "(ONELANE_IMAGE_TOTAL_BYTES); try again later",
        retry_after_s=retry_after_s,
    )
