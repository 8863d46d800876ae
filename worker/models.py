"""The models one worker holds loaded, within a memory budget: loaded on demand, the least recently used idle one
evicted to make room (as Ollama's keep-alive and max-loaded, without its reloads: load options are the server's,
so one name is one load).

All of them share one device lock: whichever model's batch steps, it is the only work on the device.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import cast

import mlx.core as mx
from mlx.utils import tree_flatten

from tasks.catalogue import ModelConfig
from tasks.context import context_of
from tasks.housekeeping import log_death
from tasks.settings import Settings
from tasks.store import WorkerStore
from worker.batch.chunking import Chunking, choose_chunk
from worker.batch.engine import Engine
from worker.batch.rows import Counters
from worker.batch.sharing import Trial, choose
from worker.batch.speculation import Speculation
from worker.gguf import prepare
from worker.load_error import explain
from worker.pace import Pace, fit, probe
from worker.pooling import Pooler
from worker.prefix_cache import PrefixCache
from worker.prefix_disk import DiskTier
from worker.prefix_file import weights_digest
from worker.preflight import unknown_architecture
from worker.unsupported import Unsupported

logger = logging.getLogger(__name__)


def size_on_disk(config: ModelConfig) -> int:
    """The weights' size before loading, its draft's too, from local folders' safetensors (0 when unknown: a hub id
    not fetched yet)."""
    folders = [Path(p) for p in (config.path, config.draft) if p is not None]
    return sum(f.stat().st_size for folder in folders if folder.is_dir() for f in folder.glob("*.safetensors"))


def size_in_memory(engine: Engine) -> int:
    """The weights' size once loaded, its draft's too (loaded and freed with it)."""
    drafter = getattr(engine, "drafter", None)  # (an embedding model's stand-in has none)
    models = [engine.model] + ([drafter.model] if drafter is not None else [])
    # (a list: mlx types tree_flatten's result as a list or a dict)
    parameters = [cast(list[tuple[str, mx.array]], tree_flatten(m.parameters())) for m in models]
    return sum(a.nbytes for weights in parameters for _, a in weights)


class ModelPool:
    """Loaded engines by model name, least recently used first. Only the thread holding `lock` loads, evicts or
    steps one; `names()`, `loading` and the counters may be read from any thread (the heartbeat reports them): they
    read a snapshot the owner replaces whole at every change."""

    def __init__(
        self, store: WorkerStore, engine: Engine | None = None, on_change: Callable[[], None] = lambda: None
    ) -> None:
        self.store = store
        s = store.settings
        disk = DiskTier(s.prefix_cache_folder, s.prefix_cache_disk_bytes, s.prefix_cache_disk_owner_bytes)
        self.prefix = PrefixCache(s.prefix_cache_bytes, disk if s.prefix_cache_disk_bytes else None)  # KV states
        self.on_change = on_change  # told when a model loaded or left (the worker reports it in its lease)
        self.pace = Pace()  # how fast each model's steps go here (the runner's loop times them; a load, before)
        self._batching: dict[str, Trial] = {}  # how each model's sequences share the batch, as its load found
        self._chunks: dict[str, int] = {}  # the prompt tokens each model reads a step, as its load found
        self.settings: Settings = store.settings
        self.lock = engine.lock if engine is not None else threading.Lock()
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._loaded: tuple[tuple[str, Engine], ...] = ()  # the snapshot other threads read
        self._bytes: dict[str, int] = {}
        self._retired = Counters()  # the work of evicted engines
        self.loading = ""
        self._unrecorded: set[str] = set()  # adopted before the device was this worker's: recorded at its load
        if engine is not None:  # already loaded (tests): it serves the default model
            self._unrecorded.add(self.settings.model_name)
            self._adopt(self.settings.model_name, engine, 0.0)

    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._loaded)

    def served_keys(self) -> dict[str, str]:
        """Every served model's prefix-cache name, by model name."""
        return {m.name: m.cache_key() for m in self.settings.catalog}

    def get(self, name: str) -> Engine | None:
        """The engine of a loaded model, now the most recently used."""
        engine = self._engines.get(name)
        if engine is not None:
            self._engines.move_to_end(name)
        return engine

    def get_quietly(self, name: str) -> Engine | None:
        """The engine of a loaded model, its place in the eviction order unchanged (for any thread)."""
        return next((engine for loaded, engine in self._loaded if loaded == name), None)

    @property
    def counters(self) -> Counters:
        total = self._retired
        for _, engine in self._loaded:
            total = total + engine.counters
        return total

    @property
    def held_bytes(self) -> int:
        return sum(self._bytes.values())

    def pooler(self, name: str) -> Pooler | None:
        """The loaded embedding model or reranker of that name, now the most recently used."""
        loaded = self.get(name)
        return loaded if isinstance(loaded, Pooler) else None

    def load(self, name: str, keep: str = "") -> Engine | None:
        """Load a served model (call it with `lock` held, and no batch running but of `keep`'s, which stays),
        evicting the least recently used models until the budget holds it. A model bigger than the whole budget loads alone. On failure the model
        is marked failed for ONELANE_MODEL_RETRY_S and its waiting jobs fail (model_unavailable); returns None.
        A model that failed (or whose load killed ONELANE_MAX_ATTEMPTS workers in a row, the last before this one)
        is not tried again until then."""
        engine = self.get(name)
        if engine is not None:
            if name in self._unrecorded:  # (only the device's holder writes a model's record)
                self._unrecorded.discard(name)
                self._record(name, 0.0)
            return engine
        config = self.settings.model_named(name)
        if config is None:  # admission checks the name; a job admitted under an older models file
            self.store.model_failed(name, f"this server no longer serves a model named {name!r}")
            return None
        for check in self.store.upkeep.check_models([name]):
            log_death(check)
            if check.blocked:
                logger.warning("model %s failed to load: not tried again before ONELANE_MODEL_RETRY_S", name)
                return None
        self._make_room(size_on_disk(config), keep=keep)
        self.loading = name
        self.store.model_loading(name)
        started = time.perf_counter()
        try:
            engine = self._read(config)
        except Exception as exc:  # a missing folder, a bad adapter, an unknown architecture, out of memory...
            self._failed(config, exc)
            return None
        if isinstance(engine, Engine):
            self._choose_chunk(config, engine)  # (first: the trial reads its prompts in chunks no bigger)
            self._try_batching(name, engine)
            self._probe(name, engine)
        self.loading = ""
        self._adopt(name, engine, time.perf_counter() - started)
        self._make_room(0, keep=name, also=keep)  # the estimate may have been low: the budget holds the measured size
        self.on_change()
        return engine

    def _read(self, config: ModelConfig) -> Engine:
        """A served model read from its folder (a GGUF imported into it the first time), by the library of its
        kind."""
        prepare(config)
        if config.draft is not None and (config.kind != "generate" or config.vision):
            raise Unsupported(
                f"{config.name} cannot have a draft model: a draft proposes tokens for a model that generates text "
                "alone (not an embedding model, a reranker or a model that reads images)"
            )
        if config.kind == "generate" and config.vision:  # a vision-language model: mlx-vlm loads it
            from worker.vision import VisionEngine

            engine = VisionEngine.load(config, self._max_batch(config), self.settings.prefill_step, lock=self.lock)
            engine.context = context_of(config.path) or engine.context  # (its language model's, tasks/context.py)
            return engine
        if config.kind == "generate":
            return Engine.load(config, self._max_batch(config), self.settings.prefill_step, lock=self.lock)
        # an embedding model or a reranker: no batch, no decode steps to time
        return cast(Engine, Pooler.load(config))  # (it stands in for one in the pool: see Pooler)

    def preflight(self, tried: str) -> None:
        """Record at once each served model but `tried` (the default, loaded or failed just now) whose folder names
        an architecture the library lacks (worker/preflight.py): its first user is refused by name, not left to
        find it out."""
        for config in self.settings.catalog:
            why = unknown_architecture(config) if config.name != tried and self.get(config.name) is None else None
            if why is not None:
                self._failed(config, why)

    def _failed(self, config: ModelConfig, exc: Exception) -> None:
        """A load failed: said in the log (a known cause in one line), the model marked failed, its jobs failed."""
        name, failure = config.name, explain(exc, config)
        if failure.cause is None:
            logger.exception("model %s failed to load from %s", name, config.path)
        else:  # a known cause, said in one line (its traceback only at debug level)
            logger.error("model %s failed to load: %s", name, failure.cause)
            logger.debug("model %s: the load's traceback", name, exc_info=True)
        self.loading = ""
        failed = self.store.model_failed(name, failure.reason)
        logger.warning("model %s: %d waiting job(s) failed (model_unavailable)", name, failed)
        self.on_change()

    def _adopt(self, name: str, engine: Engine, load_s: float) -> None:
        config = self.settings.model_named(name)
        if config is not None:
            chunk = self._chunks.get(name, self.settings.prefill_step)
            engine.configure(self._max_batch(config), chunk, self.settings.decode_floor, self._speculation)
            if self.prefix.disk is not None and isinstance(engine, Engine):  # (its entries on disk: these weights')
                try:
                    self.prefix.disk.serve(config.cache_key(), weights_digest(engine.model))
                except (AttributeError, TypeError, ValueError) as exc:  # (weights it cannot read: RAM only)
                    logger.warning("model %s: its prefix-cache entries stay in RAM (%s)", name, exc)
        self._engines[name] = engine
        self._loaded = tuple(self._engines.items())
        self._bytes[name] = size_in_memory(engine)
        if name not in self._unrecorded:
            self._record(name, load_s)
        logger.info(
            "model %s loaded in %.2f s (%.1f MiB; %d model(s), %.1f of %.1f MiB held)",
            name,
            load_s,
            self._bytes[name] / 2**20,
            len(self._engines),
            self.held_bytes / 2**20,
            self.settings.models_memory / 2**20,
        )

    def _record(self, name: str, load_s: float) -> None:
        """Record the loaded model, how it batches, shows images and speculates (for /v1/models, ETAs, /readyz)."""
        engine = self._engines[name]
        self.store.model_loaded(
            name,
            load_s,
            self._bytes[name],
            engine.batching,
            getattr(engine, "images", None),
            getattr(engine, "speculation", ""),
        )

    def _try_batching(self, name: str, engine: Engine) -> None:
        """How the model's sequences share the batch (worker/batch/sharing.py), found before its first job (once a
        process: a model evicted and loaded again shares it as before)."""
        known = self._batching.get(name)
        if known is not None:
            engine.share(known.batching)
            return
        try:
            verdict = choose(engine.model, engine.vocab, engine.max_kv_size, engine.prefill_step)
        except Exception as exc:  # the trial's own alone runs failed: its jobs will say so, one at a time
            verdict = Trial(batching="alone", why=f"the trial failed ({type(exc).__name__})", seconds=0.0)
            logger.warning("model %s: the batching trial failed", name, exc_info=True)
        self._batching[name] = verdict
        engine.share(verdict.batching)
        log = logger.info if verdict.batching != "alone" else logger.warning
        log("model %s: %s in %.2f s; its sequences run %s", name, verdict.why, verdict.seconds, verdict.batching)

    def _choose_chunk(self, config: ModelConfig, engine: Engine) -> None:
        """How many prompt tokens the model reads a step (worker/batch/chunking.py; once a process)."""
        name = config.name
        if name not in self._chunks:
            try:
                found = choose_chunk(engine.model, self.settings.prefill_step, engine.vocab)
            except Exception:  # (a model that cannot read a prompt alone: its jobs will say so)
                logger.warning("model %s: its prompt chunks could not be timed", name, exc_info=True)
                found = Chunking(self.settings.prefill_step, ())
            self._chunks[name] = found.chunk
            if found.chunk < self.settings.prefill_step:
                logger.warning(
                    "model %s: a prompt costs it more per token the more it reads at once (%s): it reads %d "
                    "token(s) a step",
                    name,
                    found.why,
                    found.chunk,
                )
        engine.configure(self._max_batch(config), self._chunks[name], self.settings.decode_floor, self._speculation)

    def _probe(self, name: str, engine: Engine) -> None:
        """Time the model's steps before its first job (worker/pace.py; once a process) and report them before it
        is told loaded, so that the first ETAs come from them."""
        if self.pace.knows(name):
            return
        started = time.perf_counter()
        try:
            steps = probe(engine.model, engine.max_batch, engine.prefill_step, engine.max_kv_size, engine.batching)
        except Exception:  # ETAs do without (as their fallback), and the batch itself will tell
            logger.warning("model %s: its steps could not be timed as it loaded", name, exc_info=True)
            return
        for step in steps:
            self.pace.observe(name, *step)
        speed = fit(steps)
        logger.info(
            "model %s: %d steps timed in %.2f s: %.1f ms a step, %.1f ms a sequence, %.2f ms a prompt token",
            name,
            len(steps),
            time.perf_counter() - started,
            speed.step_s * 1e3,
            speed.per_sequence_s * 1e3,
            speed.per_prompt_token_s * 1e3,
        )
        self.on_change()

    def _make_room(self, size: int, keep: str = "", also: str = "") -> None:
        """Evict the least recently used models (never `keep`, nor `also`) until `size` more bytes fit the budget."""
        budget = self.settings.models_memory
        for name in [n for n in self._engines if n not in (keep, also)]:
            if self.held_bytes + size <= budget:
                return
            self.evict(name)

    def evict(self, name: str) -> None:
        engine = self._engines.pop(name)
        self._retired = self._retired + engine.counters  # (a report in between may count its work twice, once)
        self._loaded = tuple(self._engines.items())
        freed = self._bytes.pop(name)
        engine.close()
        del engine
        self.prefix.drop(self.settings.model_key(name))
        gc.collect()
        mx.clear_cache()
        self.store.model_unloaded(name)
        logger.info("model %s evicted (least recently used; %.1f MiB freed)", name, freed / 2**20)

    @property
    def _speculation(self) -> Speculation:
        """How each engine's sequences propose tokens (worker/batch/speculation.py)."""
        s = self.settings
        return Speculation(s.speculate, s.speculate_budget, measured=not s.speculate_always)

    def _max_batch(self, config: ModelConfig) -> int:
        return config.max_batch or self.settings.max_batch
