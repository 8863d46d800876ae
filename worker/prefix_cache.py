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
- counters for /metrics;
- a disk tier (worker/prefix_disk.py, ONELANE_PREFIX_CACHE_DISK): every entry is also written to a folder as it is
  made, and a prompt that the disk holds more of than RAM does reads it from there (it then stays in RAM, the hot
  tier), so a session outlives a crash of its worker.

An entry is frozen as it is taken: contiguous copies of its KV state, computed at once (a lazy slice would keep the
whole batch's buffers alive, and the disk's writer thread must find nothing left to compute).

"""

from __future__ import annotations

import copy
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

from worker.prefix_disk import DiskTier, compute_state
from worker.prefix_index import Marks, SortedSequences, Tokens, nearest, within

logger = logging.getLogger(__name__)

# a shorter cached prefix is not worth copying an entry for: it is prefilled like the rest. A chat template's opening
# is worth it: SmolLM2's (its default system message, then the user's turn) is about 20 tokens of a short question's ~50
MIN_HIT_TOKENS = 16

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
    disk_hits: int = 0  # of the hits, those read from the disk tier
    disk_tokens: int = 0  # ... and the prompt tokens they read


@dataclass(frozen=True)
class Entry:
    """A kept KV state (it holds exactly the tokens it is kept under) and its size."""

    cache: list[Any]
    nbytes: int
    marks: Marks = ()  # its images' full digests, where each starts


class PrefixCache:
    """KV states by key (the model as loaded, and the owner or '' when shared: Settings.prefix_key) and token
    sequence, at most `max_bytes` of them (0: no cache), and in `disk` (None: RAM only)."""

    def __init__(self, max_bytes: int, disk: DiskTier | None = None) -> None:
        self.max_bytes = max_bytes
        self.disk = disk if max_bytes > 0 else None
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

    def reach(self, key: Key, tokens: list[int], marks: Marks = ()) -> int:
        """How many of `tokens` a fetch would read from the cache (RAM or disk), reading none."""
        if not self.enabled:
            return 0
        prompt = tuple(tokens)
        found = self._nearest(key, prompt, marks)
        on_disk = self._on_disk(key, prompt, marks)
        return max(found[1] if found else 0, on_disk[1] if on_disk else 0)

    def fetch(self, key: Key, tokens: list[int], marks: Marks = ()) -> Hit:
        """The longest cached prefix of `tokens` under `key`, in RAM or on disk, as a cache of its own; at least one
        token is left to prefill. `marks`: its images' full digests, which an entry's must equal where they meet."""
        if not self.enabled:
            return Hit(None, 0)
        self.counters.lookups += 1
        prompt = tuple(tokens)
        found = self._nearest(key, prompt, marks)
        on_disk = self._on_disk(key, prompt, marks)
        if on_disk is not None and on_disk[1] > (found[1] if found else 0):
            held, reach = on_disk
            started = time.perf_counter()
            cache = self.disk.read(key, held) if self.disk is not None else None
            if cache is not None:
                logger.info(
                    "prefix cache: %d tokens read from disk in %.3f s", len(held), time.perf_counter() - started
                )
                self.counters.disk_hits += 1
                self.counters.disk_tokens += reach
                kept = self._keep((key, held), cache, marks=self.disk.marks(key, held)) if self.disk else False
                if not kept:  # (bigger than RAM's cap: this hit has it alone)
                    return self._hit((key, held), reach, cache)
                found = (key, held), reach
        if found is None:
            return Hit(None, 0)
        name, reach = found
        self._entries.move_to_end(name)  # a hit refreshes its entry
        return self._hit(name, reach, copy.deepcopy(self._entries[name].cache))

    def _hit(self, name: Name, reach: int, cache: list[Any]) -> Hit:
        if reach < len(name[1]):
            trim_prompt_cache(cache, len(name[1]) - reach)
        self.counters.hits += 1
        self.counters.cached_tokens += reach
        return Hit(cache, reach)

    def _nearest(self, key: Key, prompt: Tokens, marks: Marks) -> tuple[Name, int] | None:
        """The entry in RAM under `key` that holds the most of `prompt` but its last token, and how many (up to an
        image whose full digest differs)."""
        held = self._held.get(key)
        if held is None:
            return None

        def trimmable(tokens: Tokens) -> bool:
            return bool(can_trim_prompt_cache(self._entries[(key, tokens)].cache))

        found = nearest(held, prompt, trimmable, MIN_HIT_TOKENS)
        if found is None:
            return None
        reach = within(found[1], self._entries[(key, found[0])].marks, marks)
        if reach < found[1] and (reach < MIN_HIT_TOKENS or not trimmable(found[0])):
            return None
        return (key, found[0]), reach

    def _on_disk(self, key: Key, prompt: Tokens, marks: Marks) -> tuple[Tokens, int] | None:
        """As _nearest, on disk."""
        found = self.disk.nearest(key, prompt, MIN_HIT_TOKENS) if self.disk is not None else None
        if found is None or self.disk is None:
            return None
        reach = within(found[1], self.disk.marks(key, found[0]), marks)
        if reach < found[1] and (reach < MIN_HIT_TOKENS or not self.disk.trimmable(key, found[0])):
            return None
        return found[0], reach

    def insert(self, key: Key, tokens: list[int], cache: list[Any], marks: Marks = ()) -> bool:
        """Keep a finished sequence's KV state (`cache` holds exactly `tokens`), in RAM (evicting the least recently
        used entries past the byte cap) and on disk; whether RAM kept it (an entry bigger than the whole cap is
        not)."""
        if not self.enabled or not tokens:
            return False
        name = (key, tuple(tokens))
        cache = _frozen(cache)
        nbytes = sum(c.nbytes for c in cache)
        if self.disk is not None:
            self.disk.write(name, cache, can_trim_prompt_cache(cache), nbytes, marks)
        return self._keep(name, cache, nbytes, marks)

    def _keep(self, name: Name, cache: list[Any], nbytes: int | None = None, marks: Marks = ()) -> bool:
        nbytes = sum(c.nbytes for c in cache) if nbytes is None else nbytes
        if nbytes > self.max_bytes:
            return False
        self._remove(name)  # (the same sequence again: the newer state takes its place, as the newest)
        key = name[0]
        if can_trim_prompt_cache(cache):  # a prompt its prefixes would serve reads this one, trimmed
            for prefix in self._held.get(key, SortedSequences()).prefixes_of(name[1]):
                self._remove((key, prefix))
        self._add(name, Entry(cache, nbytes, marks))
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


def _frozen(cache: list[Any]) -> list[Any]:
    """A KV state's contiguous copy, computed now (a cache whose class cannot be remade from its state, as none of
    mlx-lm's is, is kept as it is, computed)."""
    try:
        frozen = [type(c).from_state(tree_map(_contiguous, c.state)) for c in cache]
    except (TypeError, ValueError, AttributeError):
        frozen = cache
    compute_state(frozen)
    return frozen


def _contiguous(leaf: Any) -> Any:
    return mx.contiguous(leaf) if isinstance(leaf, mx.array) else leaf
