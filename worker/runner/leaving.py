"""A job leaves the batch: exactly one outcome recorded (completed, cancelled, failed), its KV state left to the
prefix cache when it ended as its generation meant to; or every job handed back to the queue. And a step that
raised: the engine starts afresh, and the cause is looked for among the step's runs, halving the suspects step by
step; every other run goes on where it was, no attempt counted, no text lost."""

from __future__ import annotations

import logging
import queue
import time

from tasks.job import JobStatus
from tasks.settings import Settings
from worker.batch.engine import KV
from worker.batch.sampling import sampling
from worker.grammar import GrammarError
from worker.models import ModelPool
from worker.output import OutputWriter
from worker.output_records import Ending
from worker.runner.members import Members
from worker.runner.runs import Running, generation_error

logger = logging.getLogger(__name__)


class Leaving:
    """How jobs leave the batch, and what a failed step does to them. It holds the runs that must stop (asked from
    any thread, dropped by the loop's) and a failed step's suspects kept out of the engine; `released` counts the
    times some of those were let back in (the loop looks at the queue again: none joined meanwhile)."""

    def __init__(self, settings: Settings, models: ModelPool, members: Members, writer: OutputWriter) -> None:
        self.settings = settings
        self.models = models
        self.members = members
        self.writer = writer
        self._stops: queue.SimpleQueue[Running] = queue.SimpleQueue()  # runs that must stop; the loop alone reads it
        self._deferred: list[list[Running]] = []  # suspects of a failed step kept out of the engine (see step_failed)
        self.released = 0

    @property
    def holding_out(self) -> bool:
        """Whether a failed step's cause is being looked for among runs kept out of the engine: no newcomer may
        join meanwhile, to muddle it."""
        return bool(self._deferred)

    def request_stop(self, r: Running) -> None:
        """Stop a run before the next step (any thread): see Runner.request_stop."""
        if r.stop_seen_at is None:
            r.stop_seen_at = r.tokens
        self._stops.put(r)

    def end(
        self,
        r: Running,
        reason: str | None,
        error: tuple[str, ...] | None = None,
        in_engine: bool = True,
        kv: KV | None = None,
    ) -> None:
        """Take a job out of the batch (and out of the engine, if it is still there) and record its outcome. A job
        that ended as its generation meant to leaves its KV state to the prefix cache; one cut short, none."""
        engine = self.members.engine
        assert engine is not None
        status = JobStatus.FAILED if error else JobStatus.CANCELLED if reason == "cancelled" else JobStatus.COMPLETED
        if in_engine:
            kv = engine.remove([r.uid], keep=status is JobStatus.COMPLETED).get(r.uid)
        kept = (
            kv is not None
            and status is JobStatus.COMPLETED
            and self.models.prefix.insert(r.cache_key, kv.tokens, kv.cache, engine.marks(kv.tokens))
        )
        self._deferred = [g for g in ([d for d in g if d is not r] for g in self._deferred) if g]
        self.members.leave(r)
        self.writer.end(
            Ending(
                job_id=r.job.id,
                status=status,
                finish_reason=reason,
                error=error,
                prompt_tokens=r.prompt_tokens,
                completion_tokens=r.tokens,
                stop_seen_at=r.stop_seen_at,
                cached_tokens=r.cached,
                proposed_tokens=r.proposed,
                accepted_tokens=r.accepted,
                history=r.history() if kept else "",
                stop_sequence=(r.stops.matched or "") if status is JobStatus.COMPLETED else "",
            )
        )
        logger.info("job %s: %s (%s, %d tokens)", r.job.id, status.value, reason or error and error[0], r.tokens)

    def _flush(self, r: Running) -> None:
        """A job cut short keeps the text its detokenizer and stop matcher still held back."""
        r.detokenizer.finalize()
        text, hit = r.stops.feed(r.detokenizer.last_segment)
        text += "" if hit else r.stops.flush()
        if text:
            self.writer.put_many([r.text(text)])

    def drop_stopped(self) -> None:
        """End the runs asked to stop (cancelled, client gone, taken away) that are still in the batch."""
        while not self._stops.empty():  # this loop is the only reader
            r = self._stops.get_nowait()
            if self.members.batch.by_uid.get(r.uid) is r:  # still this run
                self._flush(r)
                self.end(r, "cancelled")

    def end_overdue(self) -> None:
        """End the jobs past their time limit."""
        now, limit_s = time.monotonic(), self.settings.job_time_limit_s
        for r in [r for r in self.members.batch.by_uid.values() if now > r.deadline]:
            self._flush(r)
            self.end(r, None, error=("time_limit", f"generation ran past the time limit of {limit_s:g} s"))

    def hand_back_all(self, why: str) -> None:
        """Every run of the batch back to the queue (its output so far kept), and the batch emptied."""
        batch = self.members.batch
        shared = len(batch) > 1
        for r in list(batch.by_uid.values()):
            logger.info("job %s: handed back (%s) after %d tokens", r.job.id, why, r.tokens)
            self.writer.hand_back(r.job.id, why, shared=shared)
        self.members.clear()
        self._deferred.clear()

    def step_failed(self) -> bool:
        """A step raised: the engine starts afresh (its state cannot be trusted), and the cause is looked for among
        the step's runs: those that made no token since they joined it (a newcomer's prompt, its first step), else
        all of them. One suspect is the cause (_blame). Several: the first half joins again, the rest wait out of
        the engine until that half has made a token (release_deferred), and a next failure narrows it down. Every
        other run joins again in its place (_reseat): no attempt counted, no text lost. A run in too many failed
        steps is blamed too, so that no failure repeats without end. False if no run was in the step: nothing of
        a job failed, the device did (the caller hands every job back)."""
        members = [r for r in self.members.batch.by_uid.values() if r.uid >= 0]  # (held runs had no part in it)
        if not members:
            return False
        assert self.members.engine is not None
        for r in members:
            r.failed_steps += 1
        suspects = [r for r in members if not r.proven] or members
        limit = 2 + 2 * self.members.engine.max_batch.bit_length()  # (halving a full batch takes log2 of it steps)
        blamed = {r.job.id for r in members if r.failed_steps >= limit}
        if len(suspects) == 1:
            blamed.add(suspects[0].job.id)
        self.members.restart()
        for r in members:
            if r.job.id in blamed:
                self._blame(r, alone=len(members) == 1)
        suspects = [r for r in suspects if r.job.id not in blamed]
        if len(suspects) > 1:
            later = suspects[len(suspects) // 2 :]
            for r in later:  # in the batch (its slot, its time limit, its cancel), not in the engine
                self.members.hold(r)
            self._deferred.append(later)
        for r in suspects:
            r.proven = False
        out = {r.job.id for group in self._deferred for r in group} | set(self.members.scoring)
        for r in [r for r in self.members.batch.by_uid.values() if r.job.id not in out]:
            self._reseat(r)
        return True

    def _blame(self, r: Running, alone: bool) -> None:
        """A failed step's cause: alone in the step it fails (the error was its own); else it goes back to the front
        of the queue to run alone next, where a failure is its own (release() in tasks/lua/common.lua)."""
        if alone:
            self.end(r, None, error=generation_error(r.job.id), in_engine=False)
            return
        logger.info("job %s: handed back (generation_error: it broke a step) after %d tokens", r.job.id, r.tokens)
        self.members.leave(r)
        self.writer.hand_back(r.job.id, "generation_error", shared=True)

    def _reseat(self, r: Running) -> None:
        """A run whose KV state went with a failed step joins the engine again, its prompt and the tokens it
        generated read anew (as a requeued run's would be), without leaving the batch: its text, its attempt and its
        place stay."""
        done, cached = tuple(r.ids), r.cached
        try:
            constraint = self.members.constraint(r.job, done)
        except GrammarError:  # (never: its tokens followed the grammar)
            logger.exception("job %s: its tokens no longer follow its grammar", r.job.id)
            self.end(r, None, error=generation_error(r.job.id), in_engine=False)
            return
        r.constraint = constraint
        self.members.place(r, r.prompt, sampling(r.job), self.members.fetch(r, done), done)
        r.cached = cached  # (its usage tells what the prefix cache spared it when it joined first)

    def release_deferred(self) -> None:
        """Once every run in the engine has made a token since a failed step, the suspects that joined again did not
        cause it: those kept out last join (the cause is among them, if it was among the suspects at all)."""
        batch = self.members.batch
        if not self._deferred or not all(r.proven for r in batch.by_uid.values() if r.uid >= 0):
            return
        for r in self._deferred.pop():
            if batch.by_job.get(r.job.id) is r:  # (not ended meanwhile)
                self._reseat(r)
        self.released += 1  # (none joined while they were kept out)
