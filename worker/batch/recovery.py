"""A step that raised: the engine starts afresh, and the cause is looked for among the step's runs, halving the
suspects step by step; every other run goes on where it was, no attempt counted, no text lost."""

from __future__ import annotations

import logging

from worker.batch.leaving import Leaving
from worker.batch.runs import Running
from worker.batch.sampling import sampling
from worker.batch.state import generation_error
from worker.grammar import GrammarError

logger = logging.getLogger(__name__)


class Recovery(Leaving):
    """A failed step's cause found, the others reseated."""

    def _step_failed(self) -> None:
        """A step raised: the engine starts afresh (its state cannot be trusted), and the cause is looked for among
        the step's runs: those that made no token since they joined it (a newcomer's prompt, its first step), else
        all of them. One suspect is the cause (_blame). Several: the first half joins again, the rest wait out of
        the engine until that half has made a token (_release_deferred), and a next failure narrows it down. Every
        other run joins again in its place (_reseat): no attempt counted, no text lost. A run in too many failed
        steps is blamed too, so that no failure repeats without end."""
        assert self.engine is not None
        members = [r for r in self.batch.by_uid.values() if r.uid >= 0]  # the step's (held runs had no part in it)
        if not members:  # nothing of a job failed: the device did
            self._hand_back_all("generation_error")
            return
        for r in members:
            r.failed_steps += 1
        suspects = [r for r in members if not r.proven] or members
        limit = 2 + 2 * self.engine.max_batch.bit_length()  # (halving a full batch takes log2 of it failed steps)
        blamed = {r.job.id for r in members if r.failed_steps >= limit}
        if len(suspects) == 1:
            blamed.add(suspects[0].job.id)
        self.engine.reset()
        self.groups.clear()  # (their held runs join again on their own)
        for r in members:
            if r.job.id in blamed:
                self._blame(r, alone=len(members) == 1)
        suspects = [r for r in suspects if r.job.id not in blamed]
        if len(suspects) > 1:
            later = suspects[len(suspects) // 2 :]
            for r in later:  # in the batch (its slot, its time limit, its cancel), not in the engine
                self.batch.drop(r)
                r.uid = self.batch.hold_uid()
                self.batch.add(r)
            self._deferred.append(later)
        for r in suspects:
            r.proven = False
        out = {r.job.id for group in self._deferred for r in group} | set(self.scoring)
        for r in [r for r in self.batch.by_uid.values() if r.job.id not in out]:
            self._reseat(r)
        self._look = True

    def _blame(self, r: Running, alone: bool) -> None:
        """A failed step's cause: alone in the step it fails (the error was its own); else it goes back to the front
        of the queue to run alone next, where a failure is its own (release() in tasks/lua/common.lua)."""
        if alone:
            self._end(r, None, error=generation_error(r.job.id), in_engine=False)
            return
        logger.info("job %s: handed back (generation_error: it broke a step) after %d tokens", r.job.id, r.tokens)
        self.batch.drop(r)
        self.writer.hand_back(r.job.id, "generation_error", shared=True)

    def _reseat(self, r: Running) -> None:
        """A run whose KV state went with a failed step joins the engine again, its prompt and the tokens it
        generated read anew (as a requeued run's would be), without leaving the batch: its text, its attempt and its
        place stay."""
        done, cached = tuple(r.ids), r.cached
        try:
            constraint = self._constraint(r.job, done)
        except GrammarError:  # (never: its tokens followed the grammar)
            logger.exception("job %s: its tokens no longer follow its grammar", r.job.id)
            self._end(r, None, error=generation_error(r.job.id), in_engine=False)
            return
        self.batch.drop(r)
        r.constraint = constraint
        self._place(r, r.prompt, sampling(r.job), self.models.prefix.fetch(r.cache_key, [*r.prompt, *done]), done)
        r.cached = cached  # (its usage tells what the prefix cache spared it when it joined first)

    def _release_deferred(self) -> None:
        """Once every run in the engine has made a token since a failed step, the suspects that joined again did not
        cause it: those kept out last join (the cause is among them, if it was among the suspects at all)."""
        if not self._deferred or not all(r.proven for r in self.batch.by_uid.values() if r.uid >= 0):
            return
        for r in self._deferred.pop():
            if self.batch.by_job.get(r.job.id) is r:  # (not ended meanwhile)
                self._reseat(r)
        self._look = True  # (none joined while they were kept out)
