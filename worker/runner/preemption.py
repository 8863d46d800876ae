"""Interactive work never waits behind batch work: when an interactive job waits and the batch has no room,
batch-class runs are set aside for it, the cheapest first, each at most ONELANE_PREEMPT_LIMIT times."""

from __future__ import annotations

import logging

from tasks.job import Job
from tasks.scheduling import fits, set_aside
from tasks.settings import Settings
from worker.models import ModelPool
from worker.output import OutputWriter
from worker.runner.members import Members
from worker.runner.runs import Head, Running

logger = logging.getLogger(__name__)


class Preemption:
    """Which batch-class runs may be set aside, setting them aside, and handing them back to the queue once the
    job they made room for has joined (it comes before them in the queue, whatever their scores)."""

    def __init__(self, settings: Settings, models: ModelPool, members: Members, writer: OutputWriter) -> None:
        self.settings = settings
        self.models = models
        self.members = members
        self.writer = writer
        self._set_aside: list[str] = []  # batch-class jobs taken out for an interactive one: handed back once it joins

    def _victims(self) -> list[Running]:
        """The batch-class runs that may be set aside: in the engine, not stopping, not one of several answers, set
        aside fewer than ONELANE_PREEMPT_LIMIT times. (None while a failed step's suspects are kept out: no job is
        claimed then, see the loop's _fill.)"""
        limit, batch = self.settings.preempt_limit, self.members.batch
        if not limit or batch.solo:
            return []
        return [
            r
            for r in batch.by_uid.values()
            if r.job.spec.priority == "batch"
            and r.uid >= 0
            and r.stop_seen_at is None
            and r.job.preemptions < limit
            and r.job.spec.choice is None
            and r.job.id not in self.members.scoring
            and r.job.id not in self._set_aside
        ]

    def urgent(self, full: bool) -> bool:
        """Whether the batch has no room (`full`) and holds batch-class work to set aside for an interactive job:
        the claim then names the first interactive job waiting, not a batch-class head (tasks/lua/claim.lua)."""
        if self._set_aside:  # (room was made for one: it is claimed next)
            return True
        return full and bool(self._victims())

    def make_room(self, job: Job, head: Head) -> bool:
        """Make room for an interactive head by setting batch-class runs aside, the cheapest first, as few as it
        takes; False (none set aside) if even all of them would not make room."""
        batch, engine = self.members.batch, self.members.engine
        if job.spec.priority == "batch" or head.solo or head.side or head.invalid is not None or not batch:
            return False
        assert engine is not None
        slots, budget = engine.max_batch, self.settings.kv_budget_tokens
        chosen = set_aside(
            self._victims(),
            held=lambda r: r.prompt_tokens + r.tokens,
            room=lambda out: len(batch) - len(out) < slots and fits(head.cost, batch.costs(out), budget),
        )
        if not chosen:  # (none would make room; none needed is Joining.fits's)
            return False
        for r in chosen:
            self._preempt(r, head.id)
        return True

    def _preempt(self, r: Running, for_job: str) -> None:
        """Set a run aside: its KV state to the prefix cache (where its byte budget allows), out of the batch; it is
        handed back to the queue once the job it made room for has joined (hand_back), not counted as an attempt,
        and its next run goes on from its tokens, as after any hand-back (worker/resume.py)."""
        engine = self.members.engine
        assert engine is not None
        kv = engine.remove([r.uid], keep=True).get(r.uid)
        kept = kv is not None and self.models.prefix.insert(r.cache_key, kv.tokens, kv.cache, engine.marks(kv.tokens))
        self.members.leave(r)
        self._set_aside.append(r.job.id)
        logger.info(
            "job %s: set aside for interactive job %s after %d tokens (preemption %d; its KV state %s)",
            r.job.id,
            for_job,
            r.tokens,
            r.job.preemptions + 1,
            "kept" if kept else "not kept",
        )

    def hand_back(self) -> None:
        """The runs set aside go back to the queue (after the claim of the job they made room for)."""
        for job_id in self._set_aside:
            self.writer.hand_back(job_id, "preempted")
        self._set_aside.clear()
