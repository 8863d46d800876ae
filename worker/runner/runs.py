"""A job's bookkeeping while it is in the batch: its run, the head the loop measures, what a step brought
(worker/batch/__init__.py lists the batch's layers)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tasks.job import Job, Message, history_digest
from tasks.store import Delivered
from worker.batch.engine import KV
from worker.grammar import GrammarMatcher
from worker.output_records import Text
from worker.stops import StopMatcher


@dataclass(kw_only=True)
class Running:
    """A job in the batch, as the loop follows it."""

    job: Job
    uid: int
    prompt_tokens: int
    cost: int  # KV tokens it may come to hold: its prompt plus max_tokens
    deadline: float  # monotonic: when its time limit is up
    detokenizer: Any
    stops: StopMatcher
    solo: bool = False  # runs alone: it was in a batch that failed
    tokens: int = 0
    stop_seen_at: int | None = None
    progressed_at: float = field(default_factory=time.monotonic)  # when it last made a token, or told it progressed
    cached: int = 0  # prompt tokens read from the prefix cache
    proposed: int = 0  # tokens it proposed for its steps to check (worker/batch/speculation.py) ...
    accepted: int = 0  # ... and those kept
    cache_key: tuple[str, str] = ("", "")  # where its KV state goes in the prefix cache once it ends as meant
    constraint: GrammarMatcher | None = None  # its grammar's matcher, when its answer must follow one
    answer: list[str] = field(default_factory=list)  # its output's text as Redis holds it: earlier runs', then its own
    prompt: list[int] = field(default_factory=list)  # its prompt's tokens ...
    ids: list[int] = field(default_factory=list)  # ... and those it generated (earlier runs', then its own): to rejoin
    proven: bool = False  # it made a token since it joined the engine: a failed step is not blamed on it first
    failed_steps: int = 0  # the failed steps it was in

    def text(
        self,
        text: str,
        ids: tuple[int, ...] = (),
        resume_at: tuple[int, int] | None = None,
        logprobs: tuple[str, ...] = (),
        prompt_logprobs: str = "",
    ) -> Text:
        """New text of this job, made of the tokens `ids` (none: text held back before, or progress), with their
        log probabilities' entries if it records them; its answer grows by it."""
        if text:
            self.answer.append(text)
        return Text(
            job_id=self.job.id,
            text=text,
            prompt_tokens=self.prompt_tokens,
            ids=ids,
            cached_tokens=self.cached,
            resume_at=resume_at,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        )

    def history(self) -> str:
        """The digest of the conversation its KV state holds once it ends (its messages, then its answer, as its
        follow-up resends them), under its prefix cache's key; '' for a prompt, which has no follow-up."""
        messages = self.job.spec.messages
        if messages is None:
            return ""
        return history_digest(self.cache_key, [*messages, Message(role="assistant", content="".join(self.answer))])


@dataclass(kw_only=True)
class Head:
    """The job at the head of the queue, measured but not claimed yet (it may not fit)."""

    id: str
    tokens: list[int]  # its prompt's
    cost: int
    solo: bool
    invalid: tuple[str, ...] | None = None  # why it cannot be generated from (it is claimed only to fail)
    delivered: Delivered | None = None  # what its earlier runs generated (it was requeued), to go on from
    side: bool = False  # a pooled job: read beside the batch (worker/pooling.py), not in it
    max_tokens: int = 0  # its answer's tokens at most: its max_tokens, or what its prompt leaves of the context
    preparing: bool = False  # its images are being prepared (worker/vision_prep.py): it waits, unclaimed


@dataclass
class Roster:
    """The continuous batch's roster: its jobs by their engine uid, and what they hold of the KV budget.

    mlx-lm keeps a batch's KV cache as one array, every sequence padded to the longest: a batch of n jobs may come
    to hold n times the largest job's prompt plus max_tokens, however small the others are.
    """

    by_uid: dict[int, Running] = field(default_factory=dict)
    by_job: dict[str, Running] = field(default_factory=dict)
    _held: int = 0  # the last uid given to a run held out of the engine

    def hold_uid(self) -> int:
        """A uid for a run in the batch but not (yet) in the engine: negative, so that no engine token is its."""
        self._held -= 1
        return self._held

    def add(self, r: Running) -> None:
        self.by_uid[r.uid], self.by_job[r.job.id] = r, r

    def drop(self, r: Running) -> None:
        del self.by_uid[r.uid], self.by_job[r.job.id]

    def costs(self, without: Sequence[Running] = ()) -> list[int]:
        """The KV tokens each run may come to hold (prompt + max_tokens), but those `without`."""
        return [r.cost for r in self.by_uid.values() if r not in without]

    @property
    def solo(self) -> bool:
        return any(r.solo for r in self.by_uid.values())

    def __len__(self) -> int:
        return len(self.by_uid)


@dataclass(frozen=True)
class Finished:
    """A job whose last token came in a step, and why it ended."""

    run: Running
    reason: str  # "stop" (EOS, or a stop string hit), "length" (max_tokens)
    in_engine: bool  # still in the engine's batch (a stop string ended it, not the engine)
    kv: KV | None = None  # its KV state, when the engine ended it


@dataclass
class StepResult:
    """What one step brought, handed on in this order: every job's new text, then the jobs that ended."""

    texts: list[Text] = field(default_factory=list)
    finished: list[Finished] = field(default_factory=list)


def generation_error(job_id: str) -> tuple[str, str]:
    """The error of a job whose generation failed: the details are for the operator's log, not for the client."""
    return "generation_error", f"generation failed; the worker logged the error for job {job_id}"
