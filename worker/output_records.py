"""What the output writer (worker/output.py) carries: the records the generation loop hands it (a job's Text, its
Ending, a HandBack), the writes they become (a job's text placed where its output stands in Redis: Append), and how
each write goes into a pipeline as the script that makes it.

Apart from the writer, so that what the loop hands over and what each write is read on their own; the loop's parts
(worker/batch/) import the records from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.job import JobStatus
from tasks.store import WorkerStore


@dataclass(frozen=True, kw_only=True)
class Ending:
    """How a job ended, recorded after its last output."""

    job_id: str
    status: JobStatus
    finish_reason: str | None = None
    error: tuple[str, ...] | None = None  # (type, message[, the request field at fault])
    prompt_tokens: int = 0
    completion_tokens: int = 0
    stop_seen_at: int | None = None
    cached_tokens: int = 0  # of the prompt's: read from the prefix cache, not prefilled
    history: str = ""  # when the prefix cache kept its KV state: the digest of the conversation it holds
    stop_sequence: str = ""  # the stop string it ended at, if it did
    proposed_tokens: int = 0  # tokens its steps checked as proposed (worker/batch/speculation.py) ...
    accepted_tokens: int = 0  # ... and kept


@dataclass(frozen=True, kw_only=True)
class Text:
    """A job's new text and the tokens it is made of: from one step, as the loop hands it over, or from a window's
    steps, as the writer sends it. A run's first Text says where its output starts (`resume_at`: tokens and UTF-8
    bytes its earlier runs wrote; none for a first run)."""

    job_id: str
    text: str
    prompt_tokens: int
    ids: tuple[int, ...] = ()
    cached_tokens: int = 0
    resume_at: tuple[int, int] | None = None
    logprobs: tuple[str, ...] = ()  # the tokens' entries (tasks/logprobs.py), one per id, if the job asked for them
    prompt_logprobs: str = ""  # the prompt's entries (a JSON list), in a run's first text, if the job asked

    @property
    def n_tokens(self) -> int:
        return len(self.ids)

    def __add__(self, later: Text) -> Text:
        """This text, then `later`'s (the writer sends a window's texts of one job as one)."""
        return Text(
            job_id=self.job_id,
            text=self.text + later.text,
            prompt_tokens=later.prompt_tokens,
            ids=self.ids + later.ids,
            cached_tokens=later.cached_tokens,
            resume_at=self.resume_at,
            logprobs=self.logprobs + later.logprobs,
            prompt_logprobs=self.prompt_logprobs or later.prompt_logprobs,
        )


@dataclass(frozen=True)
class HandBack:
    """A running job put back at the front of the queue, after its output so far (see WorkerStore.hand_back)."""

    job_id: str
    why: str
    shared: bool


@dataclass(frozen=True)
class Append:
    """A job's text as written: where in its output it starts (tokens, UTF-8 bytes), so a retry is exact."""

    text: Text
    start: tuple[int, int]

    @property
    def job_id(self) -> str:
        return self.text.job_id

    @property
    def end(self) -> tuple[int, int]:
        return self.start[0] + self.text.n_tokens, self.start[1] + len(self.text.text.encode())


Item = Text | Ending | HandBack
Op = Append | Ending | HandBack


def queue_write(store: WorkerStore, op: Op, pipe: Any) -> None:
    """Queue the write `op` into `pipe` (a pipeline of `store`'s connection), as the script that makes it."""
    if isinstance(op, Append):
        t = op.text
        store.append(
            t.job_id,
            t.ids,
            t.text,
            t.prompt_tokens,
            start=op.start,
            cached_tokens=t.cached_tokens,
            logprobs=t.logprobs,
            prompt_logprobs=t.prompt_logprobs,
            pipe=pipe,
        )
    elif isinstance(op, Ending):
        store.finish(
            op.job_id,
            op.status,
            finish_reason=op.finish_reason,
            error=op.error,
            prompt_tokens=op.prompt_tokens,
            completion_tokens=op.completion_tokens,
            stop_seen_at=op.stop_seen_at,
            cached_tokens=op.cached_tokens,
            history=op.history,
            stop_sequence=op.stop_sequence,
            proposed_tokens=op.proposed_tokens,
            accepted_tokens=op.accepted_tokens,
            pipe=pipe,
        )
    elif isinstance(op, HandBack):
        store.hand_back(op.job_id, op.why, op.shared, pipe=pipe)
