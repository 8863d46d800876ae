"""Interactive work never waits behind batch work: when an interactive job waits and the batch has no room,
batch-class runs are set aside for it, the cheapest first, each at most ONELANE_PREEMPT_LIMIT times."""

from __future__ import annotations

import logging

from tasks.job import Job
from tasks.scheduling import fits, set_aside
from worker.batch.joining import Joining
from worker.batch.runs import Head, Running

logger = logging.getLogger(__name__)


class Preemption(Joining):
    """Which batch-class runs may be set aside, and setting them aside."""

    def _victims(self) -> list[Running]:
        """The batch-class runs that may be set aside: in the engine, not stopping, not one of several answers, set
        aside fewer than ONELANE_PREEMPT_LIMIT times."""
        limit = self.store.settings.preempt_limit
        if not limit or self.batch.solo or self._deferred:
            return []
        return [
            r
            for r in self.batch.by_uid.values()
            if r.job.spec.priority == "batch"
            and r.uid >= 0
            and r.stop_seen_at is None
            and r.job.preemptions < limit
            and r.job.spec.choice is None
            and r.job.id not in self.scoring
            and r.job.id not in self._set_aside
        ]

    def _urgent(self) -> bool:
        """Whether the batch has no room and holds batch-class work to set aside for an interactive job: the claim
        then names the first interactive job waiting, not a batch-class head (tasks/lua/claim.lua)."""
        if self._set_aside:  # (room was made for one: it is claimed next)
            return True
        if not self.batch or self.engine is None:
            return False
        full = len(self.batch) >= self.engine.max_batch or (self._head is not None and not self._fits(self._head))
        return full and bool(self._victims())

    def _preempt_for(self, job: Job, head: Head) -> bool:
        """Make room for an interactive head by setting batch-class runs aside, the cheapest first, as few as it
        takes; False (none set aside) if even all of them would not make room."""
        if job.spec.priority == "batch" or head.solo or head.side or head.invalid is not None or not self.batch:
            return False
        assert self.engine is not None
        slots, batch = self.engine.max_batch, self.batch
        chosen = set_aside(
            self._victims(),
            held=lambda r: r.prompt_tokens + r.tokens,
            room=lambda out: len(batch) - len(out) < slots and fits(head.cost, batch.costs(out), self.budget),
        )
        if not chosen:  # (none would make room; none needed is _fits's)
            return False
        for r in chosen:
            self._preempt(r, head.id)
        return True

    def _preempt(self, r: Running, for_job: str) -> None:
        """Set a run aside: its KV state to the prefix cache (where its byte budget allows), out of the batch; it is
        handed back to the queue once the job it made room for has joined (_fill), not counted as an attempt, and
        its next run goes on from its tokens, as after any hand-back (worker/resume.py)."""
        assert self.engine is not None
        kv = self.engine.remove([r.uid], keep=True).get(r.uid)
        kept = kv is not None and self.models.prefix.insert(
            r.cache_key, kv.tokens, kv.cache, self.engine.marks(kv.tokens)
        )
        self.batch.drop(r)
        self._set_aside.append(r.job.id)
        logger.info(
            "job %s: set aside for interactive job %s after %d tokens (preemption %d; its KV state %s)",
            r.job.id,
            for_job,
            r.tokens,
            r.job.preemptions + 1,
            "kept" if kept else "not kept",
        )
