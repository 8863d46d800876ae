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

import mlx.core as mx
from mlx.utils import tree_flatten

from tasks.catalogue import ModelConfig
from tasks.housekeeping import log_death
from tasks.settings import Settings
from tasks.store import WorkerStore
from worker.engine import Counters, Engine
from worker.gguf import GgufError, prepare
from worker.prefix_cache import PrefixCache

logger = logging.getLogger(__name__)


def size_on_disk(config: ModelConfig) -> int:
    """The weights' size before loading, from a local folder's safetensors (0 when unknown: a hub id not fetched yet)."""
    folder = Path(config.path)
    return sum(f.stat().st_size for f in folder.glob("*.safetensors")) if folder.is_dir() else 0


def size_in_memory(engine: Engine) -> int:
    """The weights' size once loaded."""
    return sum(a.nbytes for _, a in tree_flatten(engine.model.parameters()))


class ModelPool:
    """Loaded engines by model name, least recently used first. Only the thread holding `lock` loads, evicts or
    steps one; `names()`, `loading` and the counters may be read from any thread (the heartbeat reports them): they
    read a snapshot the owner replaces whole at every change."""

    def __init__(
        self, store: WorkerStore, engine: Engine | None = None, on_change: Callable[[], None] = lambda: None
    ) -> None:
        self.store = store
        s = store.settings
        self.prefix = PrefixCache(s.prefix_cache_bytes)  # of every model's KV states
        self.on_change = on_change  # told when a model loaded or left (the worker reports it in its lease)
        self.settings: Settings = store.settings
        self.lock = engine.lock if engine is not None else threading.Lock()
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._loaded: tuple[tuple[str, Engine], ...] = ()  # the snapshot other threads read
        self._bytes: dict[str, int] = {}
        self._retired = Counters()  # the work of evicted engines
        self.loading = ""
        if engine is not None:  # already loaded (tests): it serves the default model
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

    def load(self, name: str) -> Engine | None:
        """Load a served model (call it with `lock` held and no batch running), evicting the least recently used
        models until the budget holds it. A model bigger than the whole budget loads alone. On failure the model
        is marked failed for ONELANE_MODEL_RETRY_S and its waiting jobs fail (model_unavailable); returns None.
        A model that failed (or whose load killed ONELANE_MAX_ATTEMPTS workers in a row, the last before this one)
        is not tried again until then."""
        engine = self.get(name)
        if engine is not None:
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
        self._make_room(size_on_disk(config))
        self.loading = name
        self.store.model_loading(name)
        started = time.perf_counter()
        try:
            prepare(config)  # a GGUF is imported into its folder the first time
            engine = Engine.load(config, self._max_batch(config), self.settings.prefill_step, lock=self.lock)
        except Exception as exc:  # a missing folder, a bad adapter, an unknown architecture, out of memory...
            logger.exception("model %s failed to load from %s", name, config.path)
            self.loading = ""
            failed = self.store.model_failed(name, _load_error(exc))
            logger.warning("model %s: %d waiting job(s) failed (model_unavailable)", name, failed)
            self.on_change()
            return None
        self.loading = ""
        self._adopt(name, engine, time.perf_counter() - started)
        self._make_room(0, keep=name)  # the estimate may have been low: the budget holds the measured size
        self.on_change()
        return engine

    def _adopt(self, name: str, engine: Engine, load_s: float) -> None:
        config = self.settings.model_named(name)
        if config is not None:
            engine.configure(self._max_batch(config), self.settings.prefill_step)
        self._engines[name] = engine
        self._loaded = tuple(self._engines.items())
        self._bytes[name] = size_in_memory(engine)
        self.store.model_loaded(name, load_s, self._bytes[name])
        logger.info(
            "model %s loaded in %.2f s (%.1f MiB; %d model(s), %.1f of %.1f MiB held)",
            name,
            load_s,
            self._bytes[name] / 2**20,
            len(self._engines),
            self.held_bytes / 2**20,
            self.settings.models_memory / 2**20,
        )

    def _make_room(self, size: int, keep: str = "") -> None:
        """Evict the least recently used models (never `keep`) until `size` more bytes fit the budget."""
        budget = self.settings.models_memory
        for name in [n for n in self._engines if n != keep]:
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

    def _max_batch(self, config: ModelConfig) -> int:
        return config.max_batch or self.settings.max_batch


def _load_error(exc: Exception) -> str:
    """What a client may read of a load failure: the kind of error, not its text (which may name server paths); an
    import's own message names none, and says what to do."""
    if isinstance(exc, GgufError):
        return f"the model failed to load: {exc}"
    kind = "its files were not found" if isinstance(exc, (FileNotFoundError, OSError)) else "it could not be loaded"
    return f"the model failed to load ({kind}); the worker logged the error"
