"""The prefix cache's disk tier (worker/prefix_cache.py keeps RAM, the hot tier): every entry is also written to a
folder as it is made, so a worker started after a crash (SIGKILL, a power cut), or on another host that shares the
folder, reads a session's history from disk instead of prefilling it again.

- one file an entry (worker/prefix_file.py: its format; written whole or not at all), named by its content's digest,
  its metadata saying what it holds; a model retrained in place (the same path and options, other weights) reads
  none of its old entries;
- read back only if whole and holding the entry looked up: a torn or damaged file of ours is removed, a foreign one
  (another program's, another format's) is passed over and left alone; neither is ever loaded into the model;
- bounded: at most ONELANE_PREFIX_CACHE_DISK bytes in all and ONELANE_PREFIX_CACHE_DISK_OWNER a scope (an owner, or
  '' when sharing is on), the least recently used (a file's mtime, refreshed by a hit) removed first; an entry makes
  its own prefixes redundant there too;
- the files of other workers sharing the folder are seen when it changes (its mtime), at the next lookup.

A writer thread does the writing, so the batch never waits for the disk. It only serialises arrays the device
thread has already computed (PrefixCache freezes an entry first): it runs no computation of its own. A worker killed
before its writer finished loses that entry alone (the turn before it is on disk).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from mlx.utils import tree_flatten

from worker.prefix_file import Key, Name, header, identity, list_files, load_file, marks_of, write_file
from worker.prefix_index import Marks, SortedSequences, Tokens, nearest

logger = logging.getLogger(__name__)

PENDING = 16  # entries waiting for the writer; past that a new one is not written (counted)
PENDING_BYTES = 2**30  # ... and their bytes, unless the queue is empty


@dataclass
class Stored:
    """An entry's file, its size and when it was last used (its mtime)."""

    path: Path
    nbytes: int
    used: float
    trimmable: bool
    marks: Marks = ()  # its images' full digests, where each starts


@dataclass
class DiskCounters:
    """Counted since the worker started; never decreasing."""

    written: int = 0  # entries written
    not_written: int = 0  # entries offered while the writer was PENDING behind, or past a bound alone
    passed_over: int = 0  # files seen torn, damaged or foreign


class DiskTier:
    """The folder's entries by name; `write` queues one for the writer thread, `nearest` and `read` look one up."""

    def __init__(self, folder: Path, max_bytes: int, owner_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self.owner_bytes = min(owner_bytes, max_bytes)
        self.counters = DiskCounters()
        self._lock = threading.Lock()  # the index: the writer adds, the device thread looks up
        self._files: dict[Name, Stored] = {}
        self._held: dict[Key, SortedSequences] = {}
        self._names: dict[str, Name] = {}  # file name -> the entry it holds
        self._foreign: set[str] = set()  # files passed over, not read again
        self._stamp = -1  # the folder's mtime when last listed
        self._pending: queue.Queue[tuple[Name, list[Any], bool, int, Marks] | None] = queue.Queue(PENDING)
        self._pending_bytes = 0  # the KV states queued (the RAM tier may have let them go meanwhile)
        self._weights: dict[str, str] = {}  # each served model's key -> the digest of its weights (weights_digest)
        self._writer: threading.Thread | None = None

    def start(self) -> None:
        """Make the folder (only this user may read it: users' prompts, as the model saw them), list what it holds
        (within the bounds), and start the writer."""
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        self._list()
        with self._lock:  # (the bounds may have been lowered since the files were written)
            for scope in {key[1] for key in self._held}:
                self._evict(scope)
        self._writer = threading.Thread(target=self._write_all, name="prefix-disk", daemon=True)
        self._writer.start()

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        if self._writer is not None:
            self._pending.put(None)
            self._writer.join()
            self._writer = None

    def flush(self) -> None:
        """Wait until every entry queued so far is written (or refused)."""
        self._pending.join()

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(s.nbytes for s in self._files.values())

    def __len__(self) -> int:
        return len(self._files)

    # --- the device thread -----------------------------------------------------------------------------------------

    def serve(self, model: str, weights: str) -> None:
        """Read and write the entries of `model` (its cache key) as those of the weights whose digest is `weights`."""
        self._weights[model] = weights

    def write(self, name: Name, cache: list[Any], trimmable: bool, nbytes: int, marks: Marks = ()) -> None:
        """Queue a finished sequence's KV state (frozen: nothing of it is left to compute; `nbytes` of arrays) for
        the writer (once started, for a model it serves). What waits for the writer is bounded: PENDING entries,
        and PENDING_BYTES of them unless the queue is empty."""
        key = self._on_disk(name[0])
        if self._writer is None or key is None:
            return
        with self._lock:
            crowded = self._pending_bytes > 0 and self._pending_bytes + nbytes > PENDING_BYTES
            if not crowded:
                self._pending_bytes += nbytes
        if crowded:
            self.counters.not_written += 1
            return
        try:
            self._pending.put_nowait(((key, name[1]), cache, trimmable, nbytes, marks))
        except queue.Full:
            with self._lock:
                self._pending_bytes -= nbytes
            self.counters.not_written += 1

    def nearest(self, key: Key, prompt: Tokens, least: int) -> tuple[Tokens, int] | None:
        """The entry on disk under `key` that holds the most of `prompt` but its last token (its tokens), and how
        many."""
        disk_key = self._on_disk(key)
        if disk_key is None:
            return None
        self._list()
        with self._lock:
            held = self._held.get(disk_key)
            if held is None:
                return None
            found = nearest(held, prompt, lambda tokens: self._files[(disk_key, tokens)].trimmable, least)
        return found

    def marks(self, key: Key, tokens: Tokens) -> Marks:
        """The full digests of the images of the entry `tokens` under `key` (where each starts)."""
        return self._stored(key, tokens).marks

    def trimmable(self, key: Key, tokens: Tokens) -> bool:
        return self._stored(key, tokens).trimmable

    def _stored(self, key: Key, tokens: Tokens) -> Stored:
        with self._lock:
            return self._files.get((self._on_disk(key) or key, tokens)) or Stored(Path(), 0, 0.0, False)

    def _on_disk(self, key: Key) -> Key | None:
        """The key a model's entries have on disk: its cache key and its weights' digest (None: not served)."""
        weights = self._weights.get(key[0])
        return (f"{key[0]}@{weights}", key[1]) if weights else None

    def read(self, key: Key, tokens: Tokens) -> list[Any] | None:
        """The KV state of the entry `tokens` under `key`, loaded from its file, if the file is whole and holds it;
        else None (and the file is forgotten: removed if it was ours and torn)."""
        disk_key = self._on_disk(key)
        if disk_key is None:
            return None
        name = (disk_key, tokens)
        with self._lock:
            stored = self._files.get(name)
        if stored is None:
            return None
        try:
            cache = load_file(stored.path, name, stored.trimmable)
            if cache is None:
                logger.warning("prefix cache: %s is torn or damaged; removed", stored.path.name)
                self._forget(name, unlink=True)
                self.counters.passed_over += 1
                return None
            compute_state(cache)
            os.utime(stored.path)  # a hit refreshes its entry (for every worker sharing the folder)
        except FileNotFoundError:  # another worker sharing the folder removed it
            self._forget(name)
            return None
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            logger.warning("prefix cache: passed over %s (%s)", stored.path.name, exc)
            self._forget(name)
            with self._lock:
                self._foreign.add(stored.path.name)
            self.counters.passed_over += 1
            return None
        stored.used = time.time()
        return cache

    # --- the writer thread -----------------------------------------------------------------------------------------

    def _write_all(self) -> None:
        while True:
            item = self._pending.get()
            try:
                if item is None:
                    return
                self._write_one(item[0], item[1], item[2], item[4])
            except Exception:  # a full or read-only disk costs a later cold start, nothing more
                logger.exception("prefix cache: could not write an entry to %s", self.folder)
                self.counters.not_written += 1
            finally:
                if item is not None:
                    with self._lock:
                        self._pending_bytes -= item[3]
                self._pending.task_done()

    def _write_one(self, name: Name, cache: list[Any], trimmable: bool, marks: Marks) -> None:
        (_, scope), tokens = name
        written = write_file(self.folder, name, cache, trimmable, self.owner_bytes, marks)
        if written is None:  # over the scope's bound alone
            self.counters.not_written += 1
            return
        path, nbytes = written
        with self._lock:
            self._add(path.name, name, Stored(path, nbytes, time.time(), trimmable, marks))
            if trimmable:  # its prefixes are read from it, trimmed
                for prefix in self._held[name[0]].prefixes_of(tokens):
                    self._remove((name[0], prefix), unlink=True)
            self._evict(scope)
        self.counters.written += 1

    def _evict(self, scope: str) -> None:
        """Remove the least recently used files past the scope's bound, then past the folder's."""
        for bound, of_scope in ((self.owner_bytes, True), (self.max_bytes, False)):
            mine = sorted(
                (s.used, n) for n, s in self._files.items() if not of_scope or n[0][1] == scope
            )  # the oldest first
            total = sum(self._files[n].nbytes for _, n in mine)
            for _, n in mine:
                if total <= bound:
                    break
                total -= self._files[n].nbytes
                self._remove(n, unlink=True)

    # --- the index -------------------------------------------------------------------------------------------------

    def _list(self) -> None:
        """Take in the files other workers wrote (and forget those they removed) since the folder last changed."""
        try:
            stamp = os.stat(self.folder).st_mtime_ns
        except OSError:
            return
        if stamp == self._stamp:
            return
        self._stamp = stamp
        present = list_files(self.folder)
        with self._lock:
            self._foreign &= set(present)
            for gone in set(self._names) - set(present):
                self._remove(self._names[gone])
            new = [e for n, e in present.items() if n not in self._names and n not in self._foreign]
        for entry in new:
            try:
                metadata = header(Path(entry.path))
                name, trimmable = identity(metadata)
                marks = marks_of(metadata)
                stat = entry.stat()
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, TypeError) as exc:
                logger.warning("prefix cache: passed over %s (%s)", entry.name, exc)
                with self._lock:
                    self._foreign.add(entry.name)
                self.counters.passed_over += 1
                continue
            with self._lock:
                stored = Stored(Path(entry.path), stat.st_size, stat.st_mtime, trimmable, marks)
                self._add(entry.name, name, stored)

    def _add(self, file: str, name: Name, stored: Stored) -> None:
        old = self._files.get(name)
        if old is not None and old.path != stored.path:
            self._remove(name, unlink=True)  # (the same sequence again: the newer state takes its place)
        if name not in self._files:  # (new, or its older file just removed: the index holds it again)
            self._held.setdefault(name[0], SortedSequences()).add(name[1])
        self._files[name] = stored
        self._names[file] = name

    def _remove(self, name: Name, unlink: bool = False) -> None:
        stored = self._files.pop(name, None)
        if stored is None:
            return
        self._names.pop(stored.path.name, None)
        held = self._held[name[0]]
        held.remove(name[1])
        if not held:
            del self._held[name[0]]
        if unlink:
            stored.path.unlink(missing_ok=True)

    def _forget(self, name: Name, unlink: bool = False) -> None:
        with self._lock:
            self._remove(name, unlink)


def compute_state(cache: list[Any]) -> None:
    """Compute a KV cache's state arrays now (not when first read: a lazy slice keeps the batch's buffers alive)."""
    # (lists: mlx types tree_flatten's result as a list or a dict)
    flat = (cast(list[tuple[str, Any]], tree_flatten(c.state)) for c in cache)
    mx.eval([leaf for leaves in flat for _, leaf in leaves if isinstance(leaf, mx.array)])
