"""The worker process: load the model once, then consume the GPU queue with one thread."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path

import dramatiq

from tasks.broker import make_broker
from tasks.settings import Settings
from tasks.store import Store, connect
from worker import actors
from worker.engine import Engine
from worker.runner import Runner

logger = logging.getLogger(__name__)

HOUSEKEEPING_INTERVAL_S = 1.0
POLL_MS = 100  # dramatiq's Redis consumer polls; 1000 ms (its default) adds up to a second to every pickup


def ensure_model(settings: Settings) -> str:
    """The model to serve; the demo model is built under var/ on first use when ONELANE_MODEL is unset."""
    if settings.model is None and not (Path(settings.model_path) / "config.json").exists():
        from worker.demo_model import make_demo_model

        logger.info("ONELANE_MODEL is unset: building the demo model (random weights, output is noise)")
        make_demo_model(Path(settings.model_path))
    return settings.model_path


class GpuWorker:
    """One dramatiq worker, one thread, prefetch 1, plus a housekeeping thread that never touches MLX."""

    def __init__(self, settings: Settings, engine: Engine | None = None) -> None:
        self.settings = settings
        self.engine = engine or Engine.load(ensure_model(settings))
        self.store = Store(connect(settings.effective_redis_url), settings)
        self.broker = make_broker(settings)
        self.runner = Runner(self.store, self.engine)
        actors.declare(self.broker, self.runner, int(settings.job_time_limit_s * 1000))
        self.worker = dramatiq.Worker(self.broker, worker_threads=1, worker_timeout=POLL_MS)
        # A prefetched message is invisible in Redis and strands on a crash: take one at a time.
        self.worker.queue_prefetch = 1
        self.worker.delay_prefetch = 1
        self._stopping = threading.Event()
        self._housekeeping = threading.Thread(target=self._housekeep, name="housekeeping", daemon=True)

    def start(self) -> None:
        self.worker.start()
        self._housekeeping.start()
        logger.info("worker consuming (1 process, 1 thread, prefetch 1)")

    def stop(self, timeout_ms: int = 10_000) -> None:
        self._stopping.set()
        self.worker.stop(timeout=timeout_ms)
        self.broker.close()

    def _housekeep(self) -> None:
        """Expire waiting jobs whose deadline passed, so their watchers hear about it promptly."""
        while not self._stopping.wait(HOUSEKEEPING_INTERVAL_S):
            try:
                self.store.expire_due()
            except Exception as exc:  # Redis away: try again next round
                logger.warning("housekeeping failed: %s", exc)


def run(settings: Settings) -> None:
    """Run until SIGINT or SIGTERM."""
    started = time.perf_counter()
    worker = GpuWorker(settings)
    worker.start()
    logger.info("worker ready in %.2f s", time.perf_counter() - started)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    logger.info("worker stopping")
    worker.stop()
