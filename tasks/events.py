"""A job's events: the one vocabulary of its durable log, its live messages and the streams built on them.

The Lua scripts write each event as JSON with its `type` (tasks/lua/common.lua `emit`): they append it to the
job's log (keys.events) and publish it on the job's channel (keys.channel) inside the envelope
{"i": index in the log, "e": event}. This module reads both back into one record, `Event`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tasks.job import JobStatus


class EventType(str, Enum):
    """What happened to a job: it started, wrote text, went back to the queue (its worker died), or ended."""

    STARTED = "started"  # queued_s: how long it waited
    TOKEN = "token"  # text, n: what it wrote and how many tokens that is; logprobs (their entries, if the job asked
    #                  for them) and prompt_logprobs (its prompt's, in its first, if it asked: tasks/logprobs.py)
    REQUEUED = "requeued"  # attempt: the run it is waiting for now; completion_tokens: what it keeps (its next run
    #                        goes on from there); reason: worker_crashed, generation_error, stopping or preempted
    # the terminal events are the job's terminal statuses, and carry finish_reason, prompt_tokens, completion_tokens
    # and cached_tokens
    COMPLETED = JobStatus.COMPLETED.value
    FAILED = JobStatus.FAILED.value
    CANCELLED = JobStatus.CANCELLED.value
    EXPIRED = JobStatus.EXPIRED.value

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset(EventType(status.value) for status in JobStatus if status.ended)  # (fails if one is missing)


@dataclass(frozen=True, slots=True)
class Event:
    """One event of a job's log, with its index there (a stream's SSE id)."""

    index: int
    type: EventType
    text: str = ""
    n: int = 0
    queued_s: float | None = None
    attempt: int | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    logprobs: str = ""
    prompt_logprobs: str = ""
    stop_sequence: str | None = None  # a completed job's: the stop string it ended at, if it did
    reason: str = ""  # a requeued job's: why its run ended

    @classmethod
    def decode(cls, index: int, raw: str | dict[str, Any]) -> Event:
        """The event written as `raw` (its JSON, or that JSON parsed) at `index` of the log; a field this version
        does not know is left out."""
        fields = json.loads(raw) if isinstance(raw, str) else raw
        known = {name: value for name, value in fields.items() if name in _FIELDS}
        return cls(index=index, type=EventType(fields["type"]), **known)

    @classmethod
    def from_message(cls, data: str) -> Event:
        """The event a job's channel published, in its envelope {"i": index, "e": event}."""
        envelope = json.loads(data)
        return cls.decode(envelope["i"], envelope["e"])

    @property
    def terminal(self) -> bool:
        return self.type.terminal

    def payload(self) -> dict[str, Any]:
        """What a stream sends of a non-terminal event: its index and its own fields."""
        return {"index": self.index, **{name: getattr(self, name) for name in _OWN_FIELDS[self.type]}}


_FIELDS = frozenset(Event.__dataclass_fields__) - {"index", "type"}
_OWN_FIELDS = {
    EventType.STARTED: ("queued_s",),
    EventType.TOKEN: ("text", "n"),
    EventType.REQUEUED: ("attempt", "completion_tokens", "reason"),
}
