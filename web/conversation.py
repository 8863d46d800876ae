"""A chat job's page as a conversation: the turns it continues, each with the earlier job that answered it, and the
follow-up turn that continues it.

A follow-up is an ordinary job whose messages are the whole history (the job's messages, its answer, the new user
message), as a chat client resends them: it queues, streams and cancels like any job, and the worker's prefix cache
(private to the owner) already holds that history, so only the new message is prefilled. No link between the jobs
is stored: the history itself names the earlier turns, so a page finds them among the owner's kept jobs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tasks.errors import InvalidRequest
from tasks.job import Job, JobStatus, Message

History = tuple[tuple[str, str], ...]  # (role, content) of each message


@dataclass(frozen=True)
class Turn:
    """A message of the conversation; an assistant's answer names the earlier job that gave it, if still kept."""

    message: Message
    job: Job | None = None


def continuable(job: Job) -> bool:
    """A completed chat whose answer is plain text: it can be resent as the assistant's turn."""
    return job.status is JobStatus.COMPLETED and job.spec.messages is not None and not job.spec.tools


def follow_up(job: Job, text: str) -> dict[str, Any]:
    """The /v1/jobs body of the turn that continues `job` with the user's `text`, with the job's model and options."""
    if not continuable(job):
        raise InvalidRequest("only a completed chat job can be continued", param="prompt")
    if not text.strip():
        raise InvalidRequest("write a message to continue the conversation with", param="prompt")
    history = [{"role": m.role, "content": m.content} for m in job.spec.messages or ()]
    params = job.spec.params
    return {
        "messages": [*history, {"role": "assistant", "content": job.output}, {"role": "user", "content": text}],
        "model": job.spec.model,
        "priority": job.spec.priority,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "ignore_eos": params.ignore_eos,
        **({"stop": list(params.stop)} if params.stop else {}),
    }


def thread(job: Job, kept: Iterable[Job]) -> list[Turn]:
    """`job`'s messages as turns; each assistant message names the job among `kept` (the owner's) that answered it."""
    answered = {(_history(j.spec.messages), j.output): j for j in kept if j.spec.messages is not None}
    messages = job.spec.messages or ()
    return [
        Turn(m, answered.get((_history(messages[:i]), m.content)) if m.role == "assistant" else None)
        for i, m in enumerate(messages)
    ]


def _history(messages: Iterable[Message] | None) -> History:
    return tuple((m.role, m.content) for m in messages or ())
