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

from tasks.errors import InvalidRequest
from tasks.job import Job, JobSpec, JobStatus, Message
from tasks.settings import Settings
from web.schemas import make_spec

History = tuple[tuple[str, str], ...]  # (role, content) of each message


@dataclass(frozen=True)
class Turn:
    """A message of the conversation; an assistant's answer names the earlier job that gave it, if still kept."""

    message: Message
    job: Job | None = None


def continuable(job: Job) -> bool:
    """A completed chat whose answer is plain text: it can be resent as the assistant's turn."""
    return job.status is JobStatus.COMPLETED and job.spec.messages is not None and not job.spec.tools


def follow_up(job: Job, text: str, settings: Settings) -> tuple[JobSpec, float]:
    """The job (and its TTL) that continues `job` with the user's `text`: its messages as they were sent (an
    assistant's tool calls, a tool's call id), its answer, then `text`; with the job's model, options (sampling,
    penalties, biases, stops, the answer's format) and class, watched by the page."""
    if not continuable(job):
        raise InvalidRequest("only a completed chat job can be continued", param="prompt")
    if not text.strip():
        raise InvalidRequest("write a message to continue the conversation with", param="prompt")
    spec = job.spec
    messages = (
        *(spec.messages or ()),
        Message(role="assistant", content=job.output),
        Message(role="user", content=text),
    )
    return make_spec(
        spec.owner,
        settings,
        spec.params,  # (a choice's own seed: the answer it continues)
        None,
        messages,
        model=spec.model,
        priority=spec.priority,
        watched=True,
        constraint=spec.constraint,
    )


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
