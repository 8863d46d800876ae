"""The worker's heartbeat: a thread that renews the device's lease every third of it, each renewal carrying a report
of the batch (its size, the engine's work since the last report, the models held, the prefix cache's counters, the
step on the device), which the web reads for ETAs, /health and /metrics. A worker that lost the lease stops at once.
Beside it, the lease keeper (worker/keeper.py), a process of its own, renews the lease too, while this thread keeps
telling it the worker's interpreter runs: a heartbeat kept waiting by a busy machine or a native call costs a late
report, not the lease. (The worker starts the keeper before it takes the device; this thread ends it.)

Apart from the worker process (worker/main.py), which starts it and reports through it at once when it must (the
models changed, the default model loaded).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

import redis

from tasks.settings import Settings
from tasks.store import BatchReport, WorkerStore
from worker.batch.engine import Engine
from worker.keeper_link import KeeperLink
from worker.models import ModelPool
from worker.prefix_cache import CacheCounters
from worker.runner.loop import Runner

logger = logging.getLogger(__name__)


class Heartbeat:
    """Renews the lease `jobs` holds for its worker until `down`, reporting `runner`'s batch and `models`' work;
    `run` is its thread."""

    def __init__(
        self,
        settings: Settings,
        jobs: WorkerStore,
        models: ModelPool,
        runner: Runner,
        down: threading.Event,
        on_fatal: Callable[[str], None],
    ) -> None:
        self.settings = settings
        self.jobs = jobs
        self.models = models
        self.runner = runner
        self.down = down  # the worker stopped: the heartbeat ends
        self.on_fatal = on_fatal
        self._reported = (0, 0.0, 0.0, 0, 0, time.monotonic())  # engine counters at the last report, and when
        self._cache_reported = CacheCounters()  # the prefix cache's, at the last report
        self.keeper = KeeperLink(settings, jobs.worker)

    def run(self) -> None:
        """Renew the device lease, reporting the batch; a worker that lost it (presumed dead) must stop at once.

        A renewal a whole interval late means the process stalled: a native call that kept the interpreter from
        this thread, or a starved machine (the keeper held the lease meanwhile); once the renewal comes, a warning
        tells how late it was. (A worker its keeper found hung writes every thread's stack: worker/keeper.py.)"""
        every, renewed = self.settings.lease_s / 3, time.monotonic()
        try:
            while not self.down.wait(every):
                self.keeper.alive()
                try:
                    report: BatchReport | None = self.report()
                except Exception:  # a report that cannot be made must not stop the lease's renewal
                    logger.exception("heartbeat: the report failed; renewing the lease without it")
                    report = None
                try:
                    if not self.renew(report):
                        return
                except redis.RedisError as exc:
                    logger.warning("heartbeat failed: %s", exc)
                    continue
                now = time.monotonic()
                if now - renewed > 2 * every:
                    logger.warning(
                        "the heartbeat took %.1f s to renew the device lease (it renews every %.1f s; its keeper "
                        "kept it, up to %.0f s): this process stalled, or Redis was slow",
                        now - renewed,
                        every,
                        self.settings.lease_hung_s,
                    )
                renewed = now
        finally:
            self.keeper.stop()

    def renew(self, report: BatchReport | None) -> bool:
        """Renew the lease; a worker that lost it (it lapsed, or another took it) stops at once: its jobs may have
        been taken back, to run again elsewhere or here."""
        holder = self.jobs.renew_device(report)
        if holder == "ok":
            return True
        self.on_fatal(
            f"lost device {self.settings.device}: "
            + ("the lease lapsed" if holder == "lapsed" else f"worker {holder} holds it")
        )
        return False

    def report_now(self) -> None:
        try:
            self.renew(self.report())
        except redis.RedisError as exc:  # the next heartbeat tells
            logger.warning("cannot report: %s", exc)

    def report(self) -> BatchReport:
        """The batch now and the engine's work since the last report (read without the engine's lock: counters
        only grow, and a report a step out of date is fine)."""
        c, now = self.models.counters, time.monotonic()
        steps, decode_s, prefill_s, prefill_tokens, generated, then = self._reported
        self._reported = (c.steps, c.decode_s, c.prefill_s, c.prompt_tokens, c.generated_tokens, now)
        runner = self.runner
        step_s, step_limit_s = runner.watch.report()  # (read first: a step that ends meanwhile reports as running)
        engine = runner.engine or self.models.get_quietly(self.settings.model_name)
        engine = engine if isinstance(engine, Engine) else None  # (a pooler has no batch)
        prefix, before = self.models.prefix, self._cache_reported
        now_cache = self._cache_reported = replace(prefix.counters)
        return BatchReport(
            batch=len(runner.batch),
            slots=engine.max_batch if engine else self.settings.max_batch,
            tokens_per_s=(c.generated_tokens - generated) / max(now - then, 1e-3),
            steps=c.steps - steps,
            decode_s=c.decode_s - decode_s,
            prefill_s=c.prefill_s - prefill_s,
            prefill_tokens=c.prompt_tokens - prefill_tokens,
            models=self.models.names(),
            active=runner.active if runner.batch else "",
            loading=self.models.loading,
            cache_lookups=now_cache.lookups - before.lookups,
            cache_hits=now_cache.hits - before.hits,
            cache_tokens=now_cache.cached_tokens - before.cached_tokens,
            cache_disk_hits=now_cache.disk_hits - before.disk_hits,
            cache_disk_tokens=now_cache.disk_tokens - before.disk_tokens,
            cache_bytes=prefix.nbytes,
            cache_entries=len(prefix),
            pace=json.dumps({model: speed.as_list() for model, speed in runner.pace.speeds().items()}),
            step_s=step_s,
            step_limit_s=step_limit_s,
        )
