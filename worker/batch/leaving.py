"""A job leaves the batch: exactly one outcome recorded (completed, cancelled, failed), its KV state left to the
prefix cache when it ended as its generation meant to; or every job handed back to the queue."""

from __future__ import annotations

import logging
import time

from tasks.job import JobStatus
from worker.batch.engine import KV
from worker.batch.joining import Joining
from worker.batch.runs import Batch, Running
from worker.output import Ending
from worker.prefix_cache import Hit

logger = logging.getLogger(__name__)


class Leaving(Joining):
    """How jobs leave the batch."""

    def _end(
        self,
        r: Running,
        reason: str | None,
        error: tuple[str, ...] | None = None,
        in_engine: bool = True,
        kv: KV | None = None,
    ) -> None:
        """Take a job out of the batch (and out of the engine, if it is still there) and record its outcome. A job
        that ended as its generation meant to leaves its KV state to the prefix cache; one cut short, none."""
        assert self.engine is not None
        status = JobStatus.FAILED if error else JobStatus.CANCELLED if reason == "cancelled" else JobStatus.COMPLETED
        if in_engine:
            kv = self.engine.remove([r.uid], keep=status is JobStatus.COMPLETED).get(r.uid)
        kept = (
            kv is not None
            and status is JobStatus.COMPLETED
            and self.models.prefix.insert(r.cache_key, kv.tokens, kv.cache)
        )
        self.batch.drop(r)
        self.scoring.pop(r.job.id, None)
        self._deferred = [g for g in ([d for d in g if d is not r] for g in self._deferred) if g]
        self._look = True
        for held in self.groups.leave(r):  # it read its group's prompt, and left before it was read
            self.batch.drop(held.run)
            self._place(held.run, held.prompt, held.params, Hit(None, 0), ())
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

    def _drop_stopped(self) -> None:
        while not self._stops.empty():  # this loop is the only reader
            r = self._stops.get_nowait()
            if self.batch.by_uid.get(r.uid) is r:  # still this run
                self._flush(r)
                self._end(r, "cancelled")

    def _end_overdue(self) -> None:
        """End the jobs past their time limit."""
        now, limit_s = time.monotonic(), self.store.settings.job_time_limit_s
        for r in [r for r in self.batch.by_uid.values() if now > r.deadline]:
            self._flush(r)
            self._end(r, None, error=("time_limit", f"generation ran past the time limit of {limit_s:g} s"))

    def _hand_back_all(self, why: str) -> None:
        shared = len(self.batch) > 1
        for r in list(self.batch.by_uid.values()):
            logger.info("job %s: handed back (%s) after %d tokens", r.job.id, why, r.tokens)
            self.writer.hand_back(r.job.id, why, shared=shared)
        for job_id in list(self.side.runs):
            self.side.drop(job_id)
            logger.info("job %s: handed back (%s), pooled", job_id, why)
            self.writer.hand_back(job_id, why)
        self._start_afresh()

    def _start_afresh(self) -> None:
        """An empty batch, and an engine with nothing in it."""
        assert self.engine is not None
        self.engine.reset()
        self.batch = Batch()
        self.groups.clear()
        self.scoring.clear()
        self._deferred.clear()
        self._look = True
