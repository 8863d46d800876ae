"""What the batch's loop holds (`RunnerState`), shared by its parts (worker/batch/__init__.py lists them); one
thread, the loop's, owns it."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from tasks.job import Job, SamplingParams
from tasks.store import WorkerStore
from worker.batch.engine import Engine
from worker.batch.runs import Batch, Head, Running
from worker.batch.sampling import Scorer
from worker.choices import Groups
from worker.models import ModelPool
from worker.output import OutputWriter
from worker.pooling import SideWork
from worker.step_watch import StepWatch

logger = logging.getLogger(__name__)

NO_STEP = ("", 0, 0, 0.0, 0)


class RunnerState:
    """The loop's state: the batch, its engine and model, the queue's head, the output's writer."""

    def __init__(self, store: WorkerStore, models: ModelPool, on_fatal: Callable[[str], None]) -> None:
        self.store = store
        self.on_fatal = on_fatal
        self.models = models
        self.engine: Engine | None = None  # the active model's: the one the batch runs
        self.active = ""
        self.batch = Batch()
        self.queue_moved = threading.Event()  # set by the worker's listener: jobs may wait to be claimed
        self._stops: queue.SimpleQueue[Running] = queue.SimpleQueue()  # runs that must stop; the loop alone reads it
        # the loop's view of the queue (its thread alone uses these):
        self._look = True  # it may hold a job that can join now: set when it moves or a job leaves, cleared by `_fill`
        self._head: Head | None = None  # its head, measured, waiting for room in the batch
        self._set_aside: list[str] = []  # batch-class jobs taken out for an interactive one: handed back once it joins
        self.writer = OutputWriter(store, on_stop=self.request_stop, on_fatal=on_fatal)
        self.groups = Groups()  # the requests of several answers with a run in the batch (worker/choices.py)
        self.scoring: dict[str, tuple[Running, Scorer, SamplingParams]] = {}  # runs reading their prompt to score it
        self.pace = models.pace  # how fast each model's steps go here (the heartbeat reports it, for ETAs)
        self.watch = StepWatch()  # the step on the device, and how long it may run (the heartbeat reports it)
        self._last_step = NO_STEP  # the step before: its model, sequences, prompt tokens, when it started, tokens
        self._deferred: list[list[Running]] = []  # suspects of a failed step kept out of the engine (see _step_failed)
        self.side = SideWork()  # pooled jobs (embeddings, rerank) claimed: read a pass at a time between steps
        self._side_stops: queue.SimpleQueue[str] = queue.SimpleQueue()  # pooled jobs that must stop
        self._counting: dict[str, tuple[Job, Future[Any]]] = {}  # token counts whose images are being prepared

    @property
    def budget(self) -> int:
        return self.store.settings.kv_budget_tokens

    def request_stop(self, job_id: str) -> None:
        """Stop a job's run in the batch before the next step (from the cancel listener, or the writer: any
        thread). The request is for the run going on now: once that run has ended, it is void (the job may have
        been handed back and be running again). A job not in the batch yet hears it from its first output write."""
        r = self.batch.by_job.get(job_id)
        if r is None:
            if job_id in self.side.runs:
                self._side_stops.put(job_id)
            return
        if r.stop_seen_at is None:
            r.stop_seen_at = r.tokens
        self._stops.put(r)


def generation_error(job_id: str) -> tuple[str, str]:
    return "generation_error", f"generation failed; the worker logged the error for job {job_id}"
