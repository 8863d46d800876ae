"""Run one job: claim it, stream the engine's chunks into Redis, record exactly one outcome."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from tasks.errors import OnelaneError
from tasks.job import Job, JobStatus
from tasks.store import Store
from worker.engine import Engine
from worker.output import OutputWriter
from worker.stops import StopMatcher

logger = logging.getLogger(__name__)


class Runner:
    """Runs jobs for one worker process, identified by `worker_id` (the holder of the device's lease)."""

    def __init__(
        self, store: Store, engine: Engine | None, worker_id: str, on_fatal: Callable[[str], None]
    ) -> None:
        self.store = store
        self.engine = engine
        self.worker_id = worker_id
        self.on_fatal = on_fatal
        self.current: str | None = None  # the job generating now
        self.tokens = 0  # tokens it has generated so far
        self.stop = threading.Event()  # set when it must stop: checked at every token
        self.stop_seen_at: int | None = None
        self.writer = OutputWriter(store, worker_id)

    def request_stop(self, job_id: str) -> None:
        """Stop the running job at its next token, if it is `job_id` (called from the cancel listener)."""
        if job_id == self.current and not self.stop.is_set():
            self.stop_seen_at = self.tokens
            self.stop.set()

    def run_waiting(self, stopping: threading.Event) -> int:
        """Claim and run jobs in fair order until none waits or `stopping` is set; returns how many ran.

        The next job is claimed the moment one ends: on a GPU, any gap between jobs is throughput lost.
        """
        ran = 0
        while not stopping.is_set() and (job := self.store.claim_next(self.worker_id)) is not None:
            self.run(job)
            ran += 1
        return ran

    def run(self, job: Job) -> None:
        logger.info("job %s: started (owner %s, attempt %d)", job.id, job.owner, job.attempts)
        assert self.engine is not None, "the model loads before the first claim"
        self.stop.clear()
        self.current, self.tokens, self.stop_seen_at = job.id, 0, None
        writer = self.writer
        writer.begin(job.id, self.stop)
        stops = StopMatcher(job.spec.params.stop)
        reason: str | None = None
        sent = tokens = prompt_tokens = 0
        error: tuple[str, str] | None = None
        limit_s = self.store.settings.job_time_limit_s
        deadline = time.monotonic() + limit_s
        try:
            for chunk in self.engine.generate(job.spec):
                tokens, prompt_tokens = chunk.tokens, chunk.prompt_tokens
                self.tokens = tokens
                text, hit = stops.feed(chunk.text)
                if hit or chunk.finish_reason is not None:
                    text += "" if hit else stops.flush()
                writer.put(text, tokens - sent, prompt_tokens)
                sent = tokens
                if hit:
                    reason = "stop"
                    break
                if chunk.finish_reason is not None:
                    reason = chunk.finish_reason
                elif self.stop.is_set():
                    reason = "cancelled"
                    break
                elif time.monotonic() > deadline:
                    error = ("time_limit", f"generation ran past the time limit of {limit_s:g} s")
                    break
        except OnelaneError as exc:  # the job's own fault, told in our words
            logger.warning("job %s: %s", job.id, exc.message)
            error = (exc.type, exc.message)
        except Exception:  # the details are for the operator's log, not for the client
            logger.exception("job %s: generation failed", job.id)
            error = ("generation_error", f"generation failed; the worker logged the error for job {job.id}")
        self.current = None
        try:
            writer.end()
            if self.stop.is_set() and reason is None and error is None:
                reason = "cancelled"
            status = JobStatus.FAILED if error else JobStatus.CANCELLED if reason == "cancelled" else JobStatus.COMPLETED
            ended = self.store.finish(
                job.id, status, self.worker_id,
                finish_reason=reason, error=error, prompt_tokens=prompt_tokens, completion_tokens=tokens,
                stop_seen_at=self.stop_seen_at,
            )  # fmt: skip
        except redis.RedisError as exc:
            logger.warning("job %s: could not record its outcome (%s); handing it back", job.id, exc)
            self.hand_back(job)
            return
        if ended:
            logger.info("job %s: %s (%s, %d tokens)", job.id, status.value, reason, tokens)
        else:
            logger.warning("job %s: taken away from this worker (presumed dead); its outcome was dropped", job.id)

    def hand_back(self, job: Job, patience_s: float = 30.0) -> None:
        """Requeue a job whose outcome could not be recorded (Redis away), retrying until Redis answers.

        If it never does, this worker exits: its lease lapses, and the next worker recovers the job.
        """
        deadline = time.monotonic() + patience_s
        while time.monotonic() < deadline:
            try:
                logger.info("job %s: handed back: %s", job.id, self.store.hand_back(job.id, self.worker_id))
                return
            except redis.RedisError:
                time.sleep(0.5)
        self.on_fatal(f"job {job.id}: Redis unreachable for {patience_s:.0f} s")
