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

import threading
import time
from collections.abc import Callable

from tasks.store import Claim, Switch, WorkerStore
from worker.batch.engine import Engine
from worker.models import ModelPool
from worker.output import OutputWriter
from worker.pooling import SideWork
from worker.runner.claiming import Claiming
from worker.runner.joining import Joining
from worker.runner.leaving import Leaving
from worker.runner.members import Members
from worker.runner.pooled import SideJobs
from worker.runner.preemption import Preemption
from worker.runner.runs import Roster
from worker.runner.stepping import Stepping
from worker.step_watch import StepWatch

SETTLE_S = 0.05  # how long a step waits for the endings before it to be recorded, before it claims
SETTLE_IDLE_S = 1.0  # ... with nothing in the batch


class Runner:
    """Runs jobs for one worker process, through its verbs of the store (bound to its id: the device's lease holder).

    One thread runs the loop (`run_waiting`) and owns everything here; other threads only call `request_stop`, set
    `queue_moved`, and read `batch`, `engine`, `active` and `pace` for the heartbeat's report. Its parts, each
    given the batch's members (worker/batch/__init__.py lists them): `claiming` (with `preemption`), `joining`,
    `stepping`, `leaving`, `side_jobs`.

    The loop looks at the queue again when it moved, or when one of its parts made room since its last look: the
    batch lost a run or started afresh (`Members.freed`), a failed step's suspects were let back in
    (`Leaving.released`), pooled work or a count was answered (`SideJobs.ended`)."""

    def __init__(self, store: WorkerStore, models: ModelPool, on_fatal: Callable[[str], None]) -> None:
        self.store = store
        self.models = models
        self.on_fatal = on_fatal
        self.queue_moved = threading.Event()  # set by the worker's listener: jobs may wait to be claimed
        self.writer = OutputWriter(store, on_stop=self.request_stop, on_fatal=on_fatal)
        self.pace = models.pace  # how fast each model's steps go here (the heartbeat reports it, for ETAs)
        self.watch = StepWatch()  # the step on the device, and how long it may run (the heartbeat reports it)
        self.members = Members(store, models, self.writer)
        self.preemption = Preemption(store.settings, models, self.members, self.writer)
        self.claiming = Claiming(store, models, self.members, self.preemption, self.queue_moved, on_fatal)
        self.joining = Joining(store, self.members, self.writer)
        self.leaving = Leaving(store.settings, models, self.members, self.writer)
        self.stepping = Stepping(store.settings, self.members, self.leaving, self.writer, self.pace, self.watch)
        self.side_jobs = SideJobs(store, models, self.members, self.writer, self.queue_moved)
        self._seen: tuple[int, int, int] | None = None  # what the parts had done at the last look (None: look)

    @property
    def batch(self) -> Roster:
        return self.members.batch

    @property
    def engine(self) -> Engine | None:
        return self.members.engine

    @property
    def active(self) -> str:
        return self.members.active

    @property
    def side(self) -> SideWork:
        return self.side_jobs.work

    def request_stop(self, job_id: str) -> None:
        """Stop a job's run in the batch before the next step (from the cancel listener, or the writer: any
        thread). The request is for the run going on now: once that run has ended, it is void (the job may have
        been handed back and be running again). A job not in the batch yet hears it from its first output write."""
        r = self.batch.by_job.get(job_id)
        if r is None:
            self.side_jobs.request_stop(job_id)
            return
        self.leaving.request_stop(r)

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
            self._seen = None
            while True:
                if stopping.is_set() and (self.batch or self.side):
                    drain_until = drain_until or time.monotonic() + self.store.settings.drain_s
                    if time.monotonic() > drain_until:
                        self._hand_back_all("stopping")
                        return started
                if self.queue_moved.is_set():
                    self.queue_moved.clear()
                    self._seen = None
                if self._look() and not stopping.is_set():
                    started += self._fill()
                self.leaving.drop_stopped()
                self.side_jobs.drop_stopped()
                self.side_jobs.counted()
                if self.side:  # a pass of pooled work, then the batch's step: each waits one of the other at most
                    self.side_jobs.step()
                    self.stepping.pause()  # (the pass is no part of the batch's step it comes before)
                if self.batch:
                    self._step()
                    continue
                if self.side:
                    continue
                self.stepping.pause()  # (the next step's clock starts with it)
                if not self._look() or stopping.is_set():  # nothing runs, and none may join (else: look again)
                    return started

    def _look(self) -> bool:
        """Whether the queue may hold a job that can join now: it moved, or room was made since the last look."""
        return self._seen != self._done()

    def _done(self) -> tuple[int, int, int]:
        """What the parts did that may let a job join, each counted by the part that does it."""
        return self.members.freed, self.leaving.released, self.side_jobs.ended

    def _fill(self) -> int:
        """Claim jobs in fair order while one can join; returns how many started. The queue is not looked at
        again until it moves or a job leaves the batch."""
        started = 0
        # a slot goes to the next job only once the job that held it has its end in Redis: a moment, unless Redis is
        # away (the batch goes on meanwhile, and the queue is looked at again after the next step)
        if not self.writer.settle(SETTLE_S if self.batch else SETTLE_IDLE_S):
            return 0
        while not self.leaving.holding_out:  # (a failed step's cause is being looked for: no newcomer muddles it)
            claim = self.claiming.claim()
            if claim is None:
                break
            if isinstance(claim, Switch):
                go_on = self.claiming.switch(claim)
            elif claim.started:
                self._start(claim)
                started += 1
                go_on = bool(claim.behind)  # nothing else waits: no need to ask again until the queue moves
            else:
                go_on = self.claiming.consider(claim)
            if not go_on:
                break
        self.preemption.hand_back()  # (after the claim: it comes before them in the queue, whatever their scores)
        self._seen = self._done()
        return started

    def _start(self, claim: Claim) -> None:
        """A started job: pooled work and token counts beside the batch (worker/runner/pooled.py), the rest into it."""
        if not claim.job.spec.side:
            self.joining.join(claim, self.claiming.take(claim))
            return
        self.claiming.forget_head()  # (as a job that joins: the head is measured again)
        self.side_jobs.take(claim.job)

    def _step(self) -> None:
        """One step of the batch (worker/runner/stepping.py); one that raised with no run in it failed on the device,
        not on a job: every job goes back to the queue."""
        if not self.stepping.step():
            self._hand_back_all("generation_error")

    def _hand_back_all(self, why: str) -> None:
        """Every job, in the batch and beside it, back to the front of the queue; the batch starts afresh."""
        self.leaving.hand_back_all(why)
        self.side_jobs.hand_back_all(why)
