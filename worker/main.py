"""The worker process: take the device's lease, load the default model, then consume the GPU queue (other models
load on demand: worker/models.py).

One dramatiq worker thread with prefetch 1 runs the batch (worker/runner/loop.py): the only thread that touches MLX
while jobs run (a default model that failed to load is tried again, when due, by worker/default_retry.py's thread,
only while no batch holds the models' lock). A heartbeat thread renews the device lease and reports the batch
(worker/heartbeat.py), beside a lease keeper process (worker/keeper.py); a listener hears cancels, streams opened
and queue moves (worker/listener.py); a housekeeping thread (tasks/housekeeping.py, which every web process runs
too) ends jobs that must not run, recovers jobs of dead workers and re-rings a lost doorbell.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

if __name__ == "__main__":  # before the slow imports below: a Ctrl-C during them ends the process quietly
    from tasks.quiet_start import exit_quietly_on_stop

    exit_quietly_on_stop()

import dramatiq
import redis

from tasks.broker import QUEUE_NAME, make_broker
from tasks.errors import SettingsError
from tasks.housekeeping import Housekeeper
from tasks.settings import LOG_FORMAT, Settings, physical_memory
from tasks.stop_signals import stop_on_signals
from tasks.store import Store
from worker import actors
from worker.batch.engine import Engine
from worker.blas import preload_openblas
from worker.default_retry import retry_default
from worker.heartbeat import Heartbeat
from worker.listener import listen
from worker.models import ModelPool
from worker.runner.loop import Runner

logger = logging.getLogger(__name__)

TAKEOVER_POLL_S = 0.1  # how often a standby worker tries to take a free device
STOP_GRACE_S = 90.0  # how long a stop may take past the batch's drain (its hand-backs and last writes wait 30 s at
#                     most each) before the process exits anyway: a hung step or a Redis gone must not leave an
#                     orphaned worker alive for nobody; its jobs are recovered once its lease lapses
EXIT_STUCK = 70  # (EX_SOFTWARE) the exit of a stop that did not end within its time
IDLE_WAIT_MS = 500  # an idle consumer blocks this long on its wake-up list before looking again (and a stopping
#                    worker's threads notice within it)


def ensure_model(settings: Settings) -> str:
    """The model to serve; with none configured and the shipped demo model missing, a random one is built under
    var/ on first use."""
    if settings.model is None and not settings.models and not (Path(settings.model_path) / "config.json").exists():
        from worker.demo_build.model import make_demo_model

        logger.info(
            "ONELANE_MODEL is unset and worker/demo is missing: building a random demo model (its output is noise)"
        )
        make_demo_model(Path(settings.model_path))
    return settings.model_path


def _name_os_threads(consumer: dramatiq.Worker) -> None:
    """Give this process's threads their names in the OS too (Python 3.11 names them for Python only), as `top -H`
    and bench/profile_queue.py read them: dramatiq's worker thread, which runs the batch, is `generation`."""
    roles = {t.ident: "generation" for t in consumer.workers} | {
        t.ident: "consumer" for t in consumer.consumers.values()
    }
    for t in threading.enumerate():
        if t is not threading.main_thread() and t.native_id is not None:
            with contextlib.suppress(OSError):  # (no /proc: not Linux)
                Path(f"/proc/self/task/{t.native_id}/comm").write_text(roles.get(t.ident, t.name)[:15])


def _exit_now(reason: str) -> None:
    logger.error("worker exiting: %s", reason)
    os._exit(3)


class GpuWorker:
    """One dramatiq worker, one thread, prefetch 1, on one device held by a lease in Redis."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine | None = None,
        on_fatal: Callable[[str], None] = _exit_now,
        idle_wait_ms: int = IDLE_WAIT_MS,
    ) -> None:
        self.settings = settings
        self.id = uuid.uuid4().hex
        self.store = Store.connect(settings)
        self.jobs = self.store.for_worker(self.id)  # its verbs, bound to its id
        # (a change of models is reported at once, by the heartbeat made below, once the runner is)
        self.models = ModelPool(self.jobs, engine, on_change=lambda: self.heartbeat.report_now())
        self.broker = make_broker(settings)
        self.on_fatal = on_fatal
        self.stopping = threading.Event()  # asked to stop: claim nothing more, let the batch drain
        self.down = threading.Event()  # stopped: nothing of this worker runs on the device any more
        self.runner = Runner(self.jobs, self.models, on_fatal)
        actors.declare(self.broker, self.runner, self.stopping)
        # Only the GPU queue: no consumer for the delay queue, which onelane never uses.
        self.worker = dramatiq.Worker(self.broker, queues={QUEUE_NAME}, worker_threads=1, worker_timeout=idle_wait_ms)
        # A prefetched message is invisible in Redis and strands on a crash: take one at a time.
        self.worker.queue_prefetch = 1
        self.worker.delay_prefetch = 1
        self.housekeeper = Housekeeper(self.store, self.broker)
        self.heartbeat = Heartbeat(settings, self.jobs, self.models, self.runner, self.down, on_fatal)
        self._threads = [
            threading.Thread(target=self.heartbeat.run, name="heartbeat", daemon=True),
            threading.Thread(target=listen, args=(self.jobs, self.runner, self.down), name="listener", daemon=True),
            threading.Thread(
                target=retry_default, args=(self.models, self.jobs, self.stopping), name="model-retry", daemon=True
            ),
        ]

    def start(self) -> bool:
        """Wait for the device's lease, load the default model, recover what a dead worker left, then consume.

        Returns False if stopped first. Models load only once the device is ours, so a standby worker (imports
        done, its lease keeper started, waiting for the lease) holds no second copy of the weights. A default model
        that fails to load fails its own jobs; the worker serves the others.
        """
        keeper = self.heartbeat.keeper  # started first, so it renews the lease from the moment the device is taken
        keeper.start()
        if (why := keeper.ready()) is not None:
            logger.warning("the lease keeper is not ready (%s): taking the device without it", why)
        if not self._take_device():
            keeper.stop()
            return False
        keeper.hold()
        self._threads[0].start()  # heartbeat: keep the lease while the model loads
        s = self.settings
        ensure_model(s)
        with self.models.lock:
            engine = self.models.load(s.model_name)
            self.models.preflight(tried=s.model_name)
            self._start_disk_tier()
        self.heartbeat.renew(self.heartbeat.report())  # tell the batch's size and the models at once (for ETAs)
        if isinstance(engine, Engine):  # (an embedding model or a reranker holds no KV cache)
            self._log_memory(engine)
        self._threads[1].start()
        try:
            self.housekeeper.round()  # recover what a dead worker left before the first claim
        except redis.RedisError as exc:  # Redis slow or away: the housekeeper's next round (1 s) does it
            logger.warning("first housekeeping round failed: %s", exc)
        self.housekeeper.start()
        self._threads[2].start()  # a default model that failed is tried again when due, job or not
        self.worker.start()
        _name_os_threads(self.worker)
        logger.info("worker %s consuming on device %s (1 process, 1 thread, prefetch 1)", self.id, s.device)
        return True

    def stop(self, release: bool = True) -> None:
        """Stop in good order: the batch drains for ONELANE_DRAIN_S, then what still runs goes back to the front of
        the queue (that run not counted as an attempt). The lease is renewed, and cancels are heard, until then, so
        nobody takes the batch for a dead worker's. With `release`, the device is freed at the end for a standby to
        take at once; a supervised worker leaves that to its supervisor, which frees it once this process is gone
        (so the two are never seen holding the device together)."""
        self.stopping.set()
        self.housekeeper.stop()
        self.worker.stop(timeout=int((self.settings.drain_s + STOP_GRACE_S) * 1000))
        with self.models.lock:  # the runner is out of its loop: the batch drained, or was handed back
            self.runner.writer.wait_idle()
            self.runner.writer.close()
            if self.models.prefix.disk is not None:
                self.models.prefix.disk.close()  # what it has queued is written
        self.broker.close()
        self.down.set()
        if release:
            try:
                self.jobs.release_device()
            except redis.RedisError as exc:  # the lease lapses by itself
                logger.warning("could not free device %s: %s", self.settings.device, exc)

    def _log_memory(self, engine: Engine) -> None:
        """The worker's memory, in its three bounded parts: weights, the batch's KV cache, the prefix cache."""
        s = self.settings
        batch_kv = s.kv_budget_tokens * engine.kv_bytes_per_token
        logger.info(
            "batch of up to %d jobs; prefill %d tokens a step; memory: weights at most %.0f MiB, the batch's "
            "KV cache at most %d tokens = %.0f MiB (%s: %.1f KiB a token), the prefix cache at most %.0f MiB",
            engine.max_batch,
            s.prefill_step,
            s.models_memory / 2**20,
            s.kv_budget_tokens,
            batch_kv / 2**20,
            s.model_name,
            engine.kv_bytes_per_token / 1024,
            s.prefix_cache_bytes / 2**20,
        )
        total = s.models_memory + batch_kv + s.prefix_cache_bytes
        if total > physical_memory():
            logger.warning(
                "weights, batch KV cache and prefix cache may come to %.0f MiB, more than this machine's "
                "%.0f MiB: lower ONELANE_MODELS_MEMORY, ONELANE_KV_BUDGET or ONELANE_PREFIX_CACHE",
                total / 2**20,
                physical_memory() / 2**20,
            )

    def _start_disk_tier(self) -> None:
        """List the prefix cache's files (what workers before this one wrote, crashed or not) and start writing."""
        disk = self.models.prefix.disk
        if disk is None:
            return
        started = time.perf_counter()
        try:
            disk.start()
        except OSError as exc:  # an unwritable folder costs warm restarts, nothing more
            logger.warning("prefix cache: no disk tier in %s: %s", disk.folder, exc)
            self.models.prefix.disk = None
            return
        logger.info(
            "prefix cache: %d entries (%.1f MiB) on disk in %s, listed in %.2f s",
            len(disk),
            disk.nbytes / 2**20,
            disk.folder,
            time.perf_counter() - started,
        )

    def _take_device(self) -> bool:
        """Block until this worker holds the device: a second worker on the same device waits here."""
        waiting_since = time.monotonic()
        while not self.stopping.is_set():
            holder: str | None
            try:
                holder = self.jobs.take_device()
            except redis.RedisError as exc:
                logger.warning(
                    "cannot reach Redis at %s to take device %s: %s",
                    self.settings.effective_redis_url,
                    self.settings.device,
                    exc,
                )
                holder = None
            if holder == "ok":
                if time.monotonic() - waiting_since > 1:
                    logger.info("took device %s after %.1f s", self.settings.device, time.monotonic() - waiting_since)
                return True
            if holder is not None and waiting_since + 0.1 > time.monotonic():
                logger.info("device %s is held by worker %s; waiting", self.settings.device, holder)
            self.stopping.wait(min(self.settings.lease_s / 3, TAKEOVER_POLL_S))
        return False


def run(settings: Settings, supervisor: int | None = None) -> None:
    """Run one worker until SIGINT or SIGTERM, then stop in good order (see GpuWorker.stop). `supervisor`: the pid of
    the supervisor that started this process: should it be gone (killed, say), the worker stops rather than hold the
    device for nobody, and frees the device itself."""
    started = time.perf_counter()
    worker = GpuWorker(settings)
    stop_on_signals(worker.stopping)
    if supervisor is not None:
        threading.Thread(target=_orphan_watch, args=(worker, supervisor), name="orphan-watch", daemon=True).start()
    if worker.start():
        logger.info("worker ready in %.2f s", time.perf_counter() - started)
        worker.stopping.wait()
    logger.info("worker stopping: its batch has %g s to end", settings.drain_s)
    stop_within(worker, settings.drain_s + STOP_GRACE_S, release=supervisor is None or os.getppid() != supervisor)
    logger.info("worker stopped")


def stop_within(worker: GpuWorker, limit_s: float, release: bool, exit: Callable[[int], object] = os._exit) -> None:
    """GpuWorker.stop, bounded: should it not end within `limit_s` (a step hung on the device holds the models' lock;
    Redis went away mid-hand-back), the process exits with EXIT_STUCK rather than live on for nobody."""
    done = threading.Event()

    def watch() -> None:
        if not done.wait(limit_s):
            logger.error(
                "worker: its stop did not end within %g s; exiting (its jobs return once its lease lapses)", limit_s
            )
            exit(EXIT_STUCK)

    threading.Thread(target=watch, name="stop-watch", daemon=True).start()
    worker.stop(release)
    done.set()


def _orphan_watch(worker: GpuWorker, supervisor: int) -> None:
    while True:
        if os.getppid() != supervisor:
            logger.warning("worker: its supervisor (pid %d) is gone; stopping", supervisor)
            worker.stopping.set()
        if worker.stopping.wait(ORPHAN_CHECK_S):
            return


SUPERVISOR_FLAG = "--supervisor"  # `--supervisor PID`: how the supervisor starts its workers
ORPHAN_CHECK_S = 0.5


def main() -> None:
    """`python -m worker.main [--supervisor PID]`, one worker process alone or as a supervisor starts it: its
    settings from the environment."""
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        sys.exit(f"Error: {exc.message}")
    preload_openblas(settings)
    logging.basicConfig(level=settings.log_level, format=LOG_FORMAT)
    args = sys.argv[1:]
    run(settings, supervisor=int(args[args.index(SUPERVISOR_FLAG) + 1]) if SUPERVISOR_FLAG in args else None)


if __name__ == "__main__":
    main()
