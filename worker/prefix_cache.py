"""The prefix cache: KV states of finished jobs, kept so that a later prompt that starts the same way (a chat's next
turn, which resends the whole history; one app's long system prompt) prefills only what is new.

mlx-lm's LRUPromptCache does the keeping: a trie of token sequences per key, the nearest entry for a prompt (the
longest cached prefix of it, or a longer entry trimmed to the common part), least recently used entries evicted past
a byte cap, an entry's prefixes dropped when it is inserted. This module adds what it lacks for a shared server:

- the key: an entry never crosses models or load options (the model's name and a digest of its configuration),
  nor owners unless sharing is on (a prompt cache is a timing side channel: a hit answers faster, which would tell
  another user whether a prefix was sent);
- a hit refreshes the entry it came from (LRUPromptCache orders by insertion only, so a system prompt that every
  request hits would be the first to go);
- an exact hit still leaves a token to prefill (the batch generator needs one to start from);
- counters for /metrics; and saving the hottest entries when the worker stops in good order, loading them when it
  starts (mlx-lm's save_prompt_cache / load_prompt_cache, one safetensors file an entry).

Only sequences that ended as their generation meant to (EOS, a stop string, max_tokens) become entries: a job cut
short (cancelled, failed, over time, handed back) leaves none, so no later job trusts a state nobody finished.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, load_prompt_cache, save_prompt_cache

logger = logging.getLogger(__name__)

MIN_HIT_TOKENS = 32  # a shorter cached prefix is not worth copying an entry for: it is prefilled like the rest
MAX_ENTRIES = 1 << 20  # entries are bounded by bytes; a count bound only keeps the trie's bookkeeping sane
INDEX = "index.json"


@dataclass(frozen=True)
class Hit:
    """What a lookup found: a KV cache (a copy, the caller's to use) holding the prompt's first `tokens` tokens."""

    cache: list[Any] | None
    tokens: int


@dataclass
class CacheCounters:
    """Counted since the worker started; never decreasing."""

    lookups: int = 0
    hits: int = 0
    cached_tokens: int = 0


class PrefixCache:
    """KV states by key (the model as loaded, and the owner or '' when shared: Settings.prefix_key) and token
    sequence, at most `max_bytes` of them (0: no cache)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.counters = CacheCounters()
        self._lru = LRUPromptCache(max_size=MAX_ENTRIES, max_bytes=max(max_bytes, 0))

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def nbytes(self) -> int:
        return int(self._lru.nbytes)

    def __len__(self) -> int:
        return len(self._lru)

    def fetch(self, key: tuple[str, str], tokens: list[int]) -> Hit:
        """The longest cached prefix of `tokens` under `key`, as a cache of its own; at least one token is left to
        prefill."""
        if not self.enabled:
            return Hit(None, 0)
        self.counters.lookups += 1
        found = self._lru._trie.search(key, tokens)
        shorter = len(found.shorter) if found.shorter else 0
        if found.exact is not None:  # the entry mlx-lm's fetch will copy from, and how much of the prompt it holds
            used, reach = found.exact, len(tokens) - 1
        elif found.longer is not None and found.common_prefix > shorter:
            used, reach = found.longer, min(len(tokens) - 1, found.common_prefix)
        else:
            used, reach = found.shorter, shorter
        if reach < MIN_HIT_TOKENS:  # (every chat prompt shares its template's first tokens with every entry)
            return Hit(None, 0)
        cache, rest = self._lru.fetch_nearest_cache(key, tokens)
        if cache is None:
            return Hit(None, 0)
        if not rest:  # the whole prompt is cached: give back its last token to prefill
            if not can_trim_prompt_cache(cache):
                return Hit(None, 0)
            for layer in cache:
                layer.trim(1)
            rest = tokens[-1:]
        cached = len(tokens) - len(rest)
        self._touch(key, used)
        self.counters.hits += 1
        self.counters.cached_tokens += cached
        return Hit(cache, cached)

    def insert(self, key: tuple[str, str], tokens: list[int], cache: list[Any]) -> bool:
        """Keep a finished sequence's KV state (`cache` holds exactly `tokens`), evicting the least recently used
        entries past the byte cap; whether it was kept (an entry bigger than the whole cap is not)."""
        if not self.enabled or not tokens:
            return False
        # made now, not when first read: a lazy slice would keep the whole batch's buffers alive
        mx.eval([leaf for c in cache for _, leaf in tree_flatten(c.state) if isinstance(leaf, mx.array)])
        if sum(c.nbytes for c in cache) > self.max_bytes:
            return False
        self._lru.insert_cache(key, list(tokens), cache)
        return True

    def drop(self, model: str) -> None:
        """Forget a model's entries (it was evicted: its KV states are of no use without it)."""
        for key, tokens in [entry for lru in self._lru._lru._lrus.values() for entry in lru if entry[0][0] == model]:
            self._remove(key, tokens)

    def _touch(self, key: tuple[str, str], tokens: list[int] | None) -> None:
        """Make an entry the most recently used."""
        if tokens is None:
            return
        order = self._lru._lru
        with contextlib.suppress(ValueError):
            order._lrus["assistant"].remove((key, tokens))
            order._lrus["assistant"].append((key, tokens))

    def _remove(self, key: tuple[str, str], tokens: list[int]) -> None:
        entry = self._lru._trie.pop(key, tokens)
        self._lru._lru.remove(key, tokens)
        self._lru._n_bytes -= entry.nbytes
        self._lru._n_bytes_by_type[entry.cache_type] -= entry.nbytes

    # --- across a restart in good order ------------------------------------------------------------------------

    def save(self, folder: Path, models: dict[str, str]) -> int:
        """Write the entries of the loaded models (`models`: name -> model key), most recently used first, to
        `folder` (replacing what it held); returns how many."""
        shutil.rmtree(folder, ignore_errors=True)
        entries = [e for lru in self._lru._lru._lrus.values() for e in lru][::-1]  # newest first
        kept = []
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)  # users' prompts, as the model saw them
        for n, (key, tokens) in enumerate(entries):
            if key[0] not in models.values():
                continue
            entry = self._lru._trie.get(key, tokens)
            name = f"{n:06d}.safetensors"
            save_prompt_cache(str(folder / name), entry.prompt_cache)
            kept.append({"file": name, "model": key[0], "scope": key[1], "tokens": tokens})
        (folder / INDEX).write_text(json.dumps(kept))
        return len(kept)

    def load(self, folder: Path, models: dict[str, str]) -> int:
        """Take back what `save` wrote, for the models still served with the same load options (most recently
        used last, so they stay the newest), then delete it: a crash later must not load it again. Returns how
        many entries were loaded."""
        index = folder / INDEX
        if not index.exists():
            return 0
        loaded = 0
        try:
            for item in reversed(json.loads(index.read_text())):
                if item["model"] not in models.values():
                    continue
                cache = load_prompt_cache(str(folder / item["file"]))
                self.insert((item["model"], item["scope"]), item["tokens"], cache)
                loaded += 1
        except (OSError, ValueError, KeyError) as exc:  # a damaged save is only a colder start
            logger.warning("prefix cache: could not load %s (%s); starting with what loaded", folder, exc)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return loaded
