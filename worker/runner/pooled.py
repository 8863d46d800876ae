"""The batch's work beside it: pooled jobs (embeddings, rerank: worker/pooling.py), read a pass at a time between
the batch's steps, and token counts (Anthropic's count_tokens), which the tokenizer alone answers."""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from typing import Any

from tasks.errors import InvalidPrompt, InvalidRequest
from tasks.job import Job, JobStatus
from tasks.store import WorkerStore
from worker.batch.engine import Engine
from worker.models import ModelPool
from worker.output import OutputWriter
from worker.output_records import Ending, Text
from worker.pooling import Pooler, SideWork
from worker.runner.members import Members
from worker.runner.runs import generation_error
from worker.vision_prep import Preparing

logger = logging.getLogger(__name__)


class SideJobs:
    """Pooled jobs and token counts: they take no slot in the batch, nor KV budget. It holds the pooled jobs
    claimed (`work`), the counts whose images are being prepared, the pooled jobs that must stop; and `ended`, how
    many times some of its jobs were answered (the loop looks at the queue again)."""

    def __init__(
        self,
        store: WorkerStore,
        models: ModelPool,
        members: Members,
        writer: OutputWriter,
        queue_moved: threading.Event,
    ) -> None:
        self.store = store
        self.models = models
        self.members = members  # (the batch's model is kept loaded beside them; an empty batch waits on them)
        self.writer = writer
        self.queue_moved = queue_moved  # set once a count's images are prepared
        self.work = SideWork()  # pooled jobs (embeddings, rerank) claimed: read a pass at a time between steps
        self._stops: queue.SimpleQueue[str] = queue.SimpleQueue()  # pooled jobs that must stop
        self._counting: dict[str, tuple[Job, Future[Any]]] = {}  # token counts whose images are being prepared
        self.ended = 0

    def take(self, job: Job) -> None:
        """A started job beside the batch: a token count, or pooled work."""
        self._count(job) if job.spec.count else self._take_pooled(job)

    def request_stop(self, job_id: str) -> None:
        """Stop a pooled job before its next pass (any thread), if it is one of these."""
        if job_id in self.work.runs:
            self._stops.put(job_id)

    def _count(self, job: Job, again: bool = False) -> None:
        """A count of a prompt's tokens (Anthropic's count_tokens): its model's tokenizer reads it, nothing runs on
        the device; it completes at once, its prompt_tokens the count, or once its images are prepared (away from
        the device: `counted`)."""
        engine = self.models.get_quietly(job.spec.model) or self.models.load(job.spec.model, keep=self.members.active)
        if not isinstance(engine, Engine):
            why = "the model failed to load" if engine is None else f"the model {job.spec.model} generates no text"
            self.writer.end(Ending(job_id=job.id, status=JobStatus.FAILED, error=("model_unavailable", why)))
            return
        digests = [p.digest for m in job.spec.messages or () for p in m.images]
        if not again:
            self.writer.begin(job.id, live=False)
        try:
            images = (lambda: self.store.images(digests)) if digests else None  # (read off the device, if needed)
            # (a count reads no image: where the processor's writing of its images is known, no pixel is prepared)
            tokens = engine.prompt_tokens(job.spec, images, wait=not (self.members.batch or self.work), reach=len)
        except Preparing as exc:
            exc.future.add_done_callback(lambda _: self.queue_moved.set())
            self._counting[job.id] = job, exc.future
            return
        except InvalidPrompt as exc:
            self.writer.end(Ending(job_id=job.id, status=JobStatus.FAILED, error=(exc.type, exc.message)))
            return
        except Exception:  # the details are for the operator's log, not for the client
            logger.exception("job %s: its prompt could not be prepared", job.id)
            self.writer.end(Ending(job_id=job.id, status=JobStatus.FAILED, error=generation_error(job.id)))
            return
        self.writer.end(
            Ending(job_id=job.id, status=JobStatus.COMPLETED, finish_reason="stop", prompt_tokens=len(tokens))
        )
        logger.info("job %s: counted (%d prompt tokens)", job.id, len(tokens))
        self.ended += 1

    def counted(self) -> None:
        """The counts whose images were being prepared and now are (all of them, waiting for the preparer, once
        nothing else runs)."""
        for job_id, (job, future) in list(self._counting.items()):
            if future.done() or not (self.members.batch or self.work):
                future.exception()  # (waits until it is done; what went wrong, the count says)
                del self._counting[job_id]
                self._count(job, again=True)

    def _take_pooled(self, job: Job) -> None:
        """A started pooled job joins the side work (worker/pooling.py), or fails at once if its model cannot read
        its inputs."""
        pooler = self.models.pooler(job.spec.model) or self.models.load(job.spec.model, keep=self.members.active)
        logger.info(
            "job %s: started (owner %s, model %s, attempt %d, pooled)", job.id, job.owner, job.spec.model, job.attempts
        )
        if not isinstance(pooler, Pooler):
            self.writer.end(
                Ending(job_id=job.id, status=JobStatus.FAILED, error=("model_unavailable", "the model failed to load"))
            )
            return
        self.writer.begin(job.id, live=False)
        try:
            self.work.add(job, pooler)
        except InvalidRequest as exc:
            self.writer.end(
                Ending(job_id=job.id, status=JobStatus.FAILED, error=(exc.type, exc.message, exc.param or ""))
            )

    def step(self) -> None:
        """One pass of pooled work; the jobs it completed are answered (their vectors or scores, as one text)."""
        done, failed = self.work.step()
        for run in done:
            try:
                output = run.output()
            except InvalidRequest as exc:
                self.writer.end(
                    Ending(job_id=run.job.id, status=JobStatus.FAILED, error=(exc.type, exc.message, exc.param or ""))
                )
                continue
            self.writer.put_many([Text(job_id=run.job.id, text=output, prompt_tokens=run.tokens)])
            self.writer.end(
                Ending(job_id=run.job.id, status=JobStatus.COMPLETED, finish_reason="stop", prompt_tokens=run.tokens)
            )
            logger.info("job %s: completed (%d inputs, %d tokens read)", run.job.id, len(run.sequences), run.tokens)
        for run in failed:
            self.writer.end(Ending(job_id=run.job.id, status=JobStatus.FAILED, error=generation_error(run.job.id)))
        if done or failed:
            self.ended += 1

    def drop_stopped(self) -> None:
        """End the pooled jobs asked to stop that are still read."""
        while not self._stops.empty():  # this loop is the only reader
            job_id = self._stops.get_nowait()
            if self.work.drop(job_id) is not None:
                self.writer.end(Ending(job_id=job_id, status=JobStatus.CANCELLED, finish_reason="cancelled"))
                logger.info("job %s: cancelled (pooled)", job_id)

    def hand_back_all(self, why: str) -> None:
        """Every pooled job back to the queue."""
        for job_id in list(self.work.runs):
            self.work.drop(job_id)
            logger.info("job %s: handed back (%s), pooled", job_id, why)
            self.writer.hand_back(job_id, why)
