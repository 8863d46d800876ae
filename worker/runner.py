"""Run one job: claim it, stream the engine's chunks into Redis, record exactly one outcome."""

from __future__ import annotations

import logging

from dramatiq.middleware import Interrupt

from tasks.job import Job, JobStatus
from tasks.store import Store
from worker.engine import Engine
from worker.output import OutputWriter
from worker.stops import StopMatcher

logger = logging.getLogger(__name__)


class Runner:
    def __init__(self, store: Store, engine: Engine) -> None:
        self.store = store
        self.engine = engine

    def run_next(self) -> Job | None:
        """Claim the next job in fair order and run it; None when nothing was waiting."""
        job = self.store.claim_next()
        if job is not None:
            self.run(job)
        return job

    def run(self, job: Job) -> None:
        logger.info("job %s: started (owner %s, attempt %d)", job.id, job.owner, job.attempts)
        writer = OutputWriter(self.store, job.id)
        stops = StopMatcher(job.spec.params.stop)
        reason: str | None = None
        sent = tokens = prompt_tokens = 0
        error: tuple[str, str] | None = None
        try:
            for chunk in self.engine.generate(job.spec):
                tokens, prompt_tokens = chunk.tokens, chunk.prompt_tokens
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
                elif writer.stop_requested.is_set():
                    reason = "cancelled"
                    break
        except Interrupt as exc:  # dramatiq's time limit or shutdown
            error = ("time_limit", f"generation interrupted: {type(exc).__name__}")
        except Exception as exc:
            logger.exception("job %s: generation failed", job.id)
            error = ("generation_error", f"{type(exc).__name__}: {exc}")
        try:
            writer.close()
        except Exception as exc:
            error = error or ("redis_error", f"could not record output: {exc}")
        if writer.stop_requested.is_set() and reason is None and error is None:
            reason = "cancelled"
        status = JobStatus.FAILED if error else JobStatus.CANCELLED if reason == "cancelled" else JobStatus.COMPLETED
        self.store.finish(
            job.id, status, finish_reason=reason, error=error, prompt_tokens=prompt_tokens, completion_tokens=tokens
        )
        logger.info("job %s: %s (%s, %d tokens)", job.id, status.value, reason, tokens)
