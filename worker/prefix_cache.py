"""The prefix cache: KV states of finished jobs, kept so that a later prompt that starts the same way (a chat's next
turn, which resends the whole history; one app's long system prompt) prefills only what is new.

onelane keeps the entries itself, in one ordered dict (least recently used first) with their sizes, and each key's
token sequences sorted for the lookup (worker/prefix_index.py). It asks mlx-lm only for what its public API offers:
copying, trimming and measuring a KV cache, and writing one to a file. (mlx-lm's LRUPromptCache does the keeping for
its own server, but its public methods can neither refresh, list nor remove one entry.)

- an entry is keyed by the model as loaded (its name and a digest of its configuration), its scope (the owner, or ''
  when sharing is on: a prompt cache is a timing side channel, a hit answers faster, which would tell another user
  whether a prefix was sent) and its tokens;
- a prompt reads from the entry holding most of it: one of its prefixes, or one that goes on past where the two
  part, trimmed back to their common part; at least one token is left to prefill (the batch needs one to start from);
- a hit refreshes its entry (a system prompt that every request hits stays); past the byte cap the least recently
  used go; an entry makes its own prefixes redundant (a hit on them reads it, trimmed); a model's entries go with it;
- counters for /metrics; and saving the hottest entries (up to ONELANE_PREFIX_CACHE_SAVED bytes) when the worker
  stops in good order, loading them when it starts (mlx-lm's save_prompt_cache / load_prompt_cache, one safetensors
  file an entry).

Only sequences that ended as their generation meant to (EOS, a stop string, max_tokens) become entries: a job cut
short (cancelled, failed, over time, handed back) leaves none, so no later job trusts a state nobody finished.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import can_trim_prompt_cache, load_prompt_cache, save_prompt_cache, trim_prompt_cache

from worker.prefix_index import SortedSequences, Tokens

logger = logging.getLogger(__name__)

# a shorter cached prefix is not worth copying an entry for: it is prefilled like the rest. A chat template's opening
# is worth it: SmolLM2's (its default system message, then the user's turn) is about 20 tokens of a short question's ~50
MIN_HIT_TOKENS = 16
INDEX = "index.json"

Key = tuple[str, str]  # the model as loaded (ModelConfig.cache_key) and the scope (Settings.cache_scope)
Name = tuple[Key, Tokens]  # an entry's: its key and its tokens


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


@dataclass(frozen=True)
class Entry:
    """A kept KV state (it holds exactly the tokens it is kept under) and its size."""

    cache: list[Any]
    nbytes: int


class PrefixCache:
    """KV states by key (the model as loaded, and the owner or '' when shared: Settings.prefix_key) and token
    sequence, at most `max_bytes` of them (0: no cache)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.counters = CacheCounters()
        self._entries: OrderedDict[Name, Entry] = OrderedDict()  # the least recently used first
        self._held: dict[Key, SortedSequences] = {}  # each key's token sequences, for the lookup
        self._nbytes = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def nbytes(self) -> int:
        """The entries' KV states, as mlx-lm measures them."""
        return self._nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def holds(self, key: Key, tokens: list[int]) -> bool:
        """Whether the sequence `tokens` is kept under `key`."""
        return (key, tuple(tokens)) in self._entries

    def fetch(self, key: Key, tokens: list[int]) -> Hit:
        """The longest cached prefix of `tokens` under `key`, as a cache of its own; at least one token is left to
        prefill."""
        if not self.enabled:
            return Hit(None, 0)
        self.counters.lookups += 1
        found = self._nearest(key, tuple(tokens))
        if found is None:
            return Hit(None, 0)
        name, reach = found
        self._entries.move_to_end(name)  # a hit refreshes its entry
        cache = copy.deepcopy(self._entries[name].cache)
        if reach < len(name[1]):
            trim_prompt_cache(cache, len(name[1]) - reach)
        self.counters.hits += 1
        self.counters.cached_tokens += reach
        return Hit(cache, reach)

    def _nearest(self, key: Key, prompt: Tokens) -> tuple[Name, int] | None:
        """The entry under `key` that holds the most of `prompt` but its last token, and how many it holds: of
        equals the shortest (the least to copy and trim); one that goes on past them only if it can be trimmed."""
        held = self._held.get(key)
        if held is None:
            return None
        reach = min(held.most_shared(prompt), len(prompt) - 1)
        if reach < MIN_HIT_TOKENS:
            return None
        best = min(held.starting_with(prompt[:reach]), key=len)
        if len(best) == reach or can_trim_prompt_cache(self._entries[(key, best)].cache):
            return (key, best), reach
        within = [s for s in held.prefixes_of(prompt) if len(s) >= MIN_HIT_TOKENS]  # (no trimming needed)
        return ((key, within[-1]), len(within[-1])) if within else None

    def insert(self, key: Key, tokens: list[int], cache: list[Any]) -> bool:
        """Keep a finished sequence's KV state (`cache` holds exactly `tokens`), evicting the least recently used
        entries past the byte cap; whether it was kept (an entry bigger than the whole cap is not)."""
        if not self.enabled or not tokens:
            return False
        # made now, not when first read: a lazy slice would keep the whole batch's buffers alive
        mx.eval([leaf for c in cache for _, leaf in tree_flatten(c.state) if isinstance(leaf, mx.array)])
        nbytes = sum(c.nbytes for c in cache)
        if nbytes > self.max_bytes:
            return False
        name = (key, tuple(tokens))
        self._remove(name)  # (the same sequence again: the newer state takes its place, as the newest)
        if can_trim_prompt_cache(cache):  # a prompt its prefixes would serve reads this one, trimmed
            for prefix in self._held.get(key, SortedSequences()).prefixes_of(name[1]):
                self._remove((key, prefix))
        self._add(name, Entry(cache, nbytes))
        while self._nbytes > self.max_bytes:
            self._remove(next(iter(self._entries)))
        return True

    def drop(self, model: str) -> None:
        """Forget a model's entries (it was evicted: its KV states are of no use without it)."""
        for name in [n for n in self._entries if n[0][0] == model]:
            self._remove(name)

    def _add(self, name: Name, entry: Entry) -> None:
        self._entries[name] = entry
        self._held.setdefault(name[0], SortedSequences()).add(name[1])
        self._nbytes += entry.nbytes

    def _remove(self, name: Name) -> None:
        entry = self._entries.pop(name, None)
        if entry is None:
            return
        self._nbytes -= entry.nbytes
        key, tokens = name
        self._held[key].remove(tokens)
        if not self._held[key]:
            del self._held[key]

    # --- across a restart in good order ------------------------------------------------------------------------

    def save(self, folder: Path, models: dict[str, str], max_bytes: int) -> tuple[int, int]:
        """Write the entries of the loaded models (`models`: name -> model key), most recently used first, to
        `folder` (replacing what it held), those that fit within `max_bytes` of files (ONELANE_PREFIX_CACHE_SAVED:
        the cache itself may hold gigabytes, which a restart need not wait for); returns how many, and their bytes."""
        shutil.rmtree(folder, ignore_errors=True)
        served = set(models.values())
        newest_first = [(name, entry) for name, entry in reversed(self._entries.items()) if name[0][0] in served]
        if max_bytes <= 0 or not newest_first:
            return 0, 0
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)  # users' prompts, as the model saw them
        kept: list[dict[str, Any]] = []
        written = 2  # the index's brackets
        for ((model, scope), tokens), entry in newest_first:
            item = {"file": f"{len(kept):06d}.safetensors", "model": model, "scope": scope, "tokens": list(tokens)}
            listed = len(json.dumps(item)) + 2  # its line of the index, with a separator
            if written + listed + _state_bytes(entry.cache) > max_bytes:  # (the file's arrays: less than the file)
                continue
            file = folder / item["file"]
            save_prompt_cache(str(file), entry.cache)
            size = file.stat().st_size + listed
            if written + size > max_bytes:  # its header tipped it over
                file.unlink()
                continue
            written += size
            kept.append(item)
        (folder / INDEX).write_text(json.dumps(kept))
        if len(kept) < len(newest_first):
            logger.info(
                "prefix cache: %d entries not saved, past ONELANE_PREFIX_CACHE_SAVED (%.1f MiB)",
                len(newest_first) - len(kept),
                max_bytes / 2**20,
            )
        return len(kept), written

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


def _state_bytes(cache: list[Any]) -> int:
    """The bytes of the arrays a cache's file holds (its state: the tokens it holds, not its allocated room)."""
    return sum(leaf.nbytes for c in cache for _, leaf in tree_flatten(c.state) if isinstance(leaf, mx.array))
