"""Run jobs as one continuous batch: claim in fair order while a slot and the KV budget allow, advance every job by
one token per step, and record exactly one outcome per job.

The batch runs one model at a time (the `active` one). A job of another model waits for the batch to drain and its
model to be ready; meanwhile jobs of a ready model may go ahead of it within ONELANE_MODEL_SWITCH_WAIT_S (the claim
decides: tasks/lua/claim.lua), so mixed traffic does not switch models at every job.

The loop owns the engine (one thread, one step at a time on the device). It never waits on Redis while jobs
generate, except to claim: output, endings and hand-backs go through the writer's thread, in order per job.
Before every step it drops the jobs that must stop (cancelled, client gone, taken away, over their time limit),
so a stopped job gets no token from the step after the one in which its stop was heard.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from tasks.errors import LeaseLost
from tasks.store import Claim, Switch
from worker.batch.pooled import SideJobs
from worker.batch.preemption import Preemption
from worker.batch.state import NO_STEP
from worker.batch.stepping import Stepping

logger = logging.getLogger(__name__)

SETTLE_S = 0.05  # how long a step waits for the endings before it to be recorded, before it claims
SETTLE_IDLE_S = 1.0  # ... with nothing in the batch


class Runner(Stepping, Preemption, SideJobs):
    """Runs jobs for one worker process, through its verbs of the store (bound to its id: the device's lease holder).

    One thread runs the loop (`run_waiting`) and owns everything here; other threads only call `request_stop`, set
    `queue_moved`, and read `batch`, `engine`, `active` and `pace` for the heartbeat's report. Its parts: see
    worker/batch/__init__.py."""

    def run_waiting(self, stopping: threading.Event) -> int:
        """Run the batch until nothing runs and nothing that can run waits; returns how many jobs started.

        A job joins the moment a slot (and room in the KV budget) is free, and the next one is claimed as soon as
        one ends: on a GPU, any gap is throughput lost. Once `stopping` is set nothing more is claimed; the jobs
        in the batch have ONELANE_DRAIN_S to end, then the rest go back to the front of the queue (that run not
        counted as an attempt) for the next worker.
        """
        started = 0
        drain_until: float | None = None
        with self.models.lock:
            self._look = True
            while True:
                if stopping.is_set() and (self.batch or self.side):
                    drain_until = drain_until or time.monotonic() + self.store.settings.drain_s
                    if time.monotonic() > drain_until:
                        self._hand_back_all("stopping")
                        return started
                if self.queue_moved.is_set():
                    self.queue_moved.clear()
                    self._look = True
                if self._look and not stopping.is_set():
                    started += self._fill()
                self._drop_stopped()
                self._drop_side_stopped()
                if self._counting:
                    self._counted()
                if self.side:  # a pass of pooled work, then the batch's step: each waits one of the other at most
                    self._side_step()
                if self.batch:
                    self._step()
                    continue
                if self.side:
                    continue
                self._last_step = NO_STEP  # (the next step's clock starts with it)
                if not self._look or stopping.is_set():  # nothing runs, and none may join (else: look again)
                    return started

    def _fill(self) -> int:
        """Claim jobs in fair order while one can join; returns how many started. The queue is not looked at
        again until it moves or a job leaves the batch."""
        started = 0
        # a slot goes to the next job only once the job that held it has its end in Redis: a moment, unless Redis is
        # away (the batch goes on meanwhile, and the queue is looked at again after the next step)
        if not self.writer.settle(SETTLE_S if self.batch else SETTLE_IDLE_S):
            return 0
        while self._has_slot():
            claim = self._claim()
            if claim is None:
                break
            if isinstance(claim, Switch):
                go_on = self._on_switch(claim)
            elif claim.started:
                self._start(claim)
                started += 1
                go_on = bool(claim.behind)  # nothing else waits: no need to ask again until the queue moves
            else:
                go_on = self._on_head(claim)
            if not go_on:
                break
        for job_id in self._set_aside:  # (after the claim: it comes before them in the queue, whatever their scores)
            self.writer.hand_back(job_id, "preempted")
        self._set_aside.clear()
        self._look = False
        return started

    def _start(self, claim: Claim) -> None:
        """A started job: pooled work and token counts beside the batch (worker/batch/pooled.py), the rest into it."""
        job = claim.job
        if not job.spec.side:
            self._join(claim)
            return
        self._head = None  # (as a job that joins: the head is measured again)
        self._count(job) if job.spec.count else self._take_pooled(job)

    def _has_slot(self) -> bool:
        """Whether a job may be claimed: any job into an empty batch; else the head, if it fits (_fits)."""
        return not self._deferred  # a failed step's cause is being looked for: no newcomer muddles it

    def _claim(self) -> Claim | Switch | None:
        """The next claim: any job into an empty batch; else the measured head, named if it fits now. None when
        nothing waits, or Redis does not answer (the batch goes on; housekeeping rings again once Redis answers)."""
        if not self.batch:
            want: str | None = "*"  # any job fits an empty batch: claim it in one round trip
        else:
            want = self._head.id if self._head and self._fits(self._head) else None
        try:
            claim = self.store.claim_next(
                want=want,
                active=self.active if self.batch else "",
                loaded=self.models.names(),
                urgent=self._urgent(),
            )
        except redis.RedisError as exc:
            logger.warning("cannot claim: %s", exc)
            return None
        except LeaseLost as exc:  # the lease lapsed, or another worker holds it: this batch is no longer ours
            self.on_fatal(exc.message)
            return None
        if claim is None:
            self._head = None
        return claim

    def _on_switch(self, switch: Switch) -> bool:
        """The next job needs another model: with the batch empty, load it and claim again (a failed load fails
        the model's jobs: the claim moves on); else the batch drains first (a job leaving it looks again)."""
        if switch.load and switch.side:  # a pooled job's model loads beside the batch, which stays
            logger.info("job %s needs model %s: loading it beside the batch", switch.head, switch.model)
            if not self.batch:
                self.engine = None  # held here, an evicted model's weights could not be freed
            self.models.load(switch.model, keep=self.active if self.batch else "")
            return True
        if switch.load and not self.batch:
            logger.info("job %s needs model %s: loading it", switch.head, switch.model)
            self.engine = None  # held here, an evicted model's weights could not be freed
            self.models.load(switch.model)
            return True
        self._head = None
        return False

    def _on_head(self, claim: Claim) -> bool:
        """The head, not claimed: measure it (once), and claim it by name if it fits now, or once batch-class work
        is set aside for it (an interactive job); else it waits until a job leaves the batch."""
        if self._head is None or self._head.id != claim.job.id or self._head.preparing:
            self._head = self._measure(claim)
        if self._head.preparing:  # it is claimed once its images are prepared (the queue moves then)
            return False
        return self._fits(self._head) or self._preempt_for(claim.job, self._head)
