"""The prefix cache's entry files, one at a time (worker/prefix_disk.py, the disk tier, keeps the folder of them):
what a file is named and says, how it is written whole or not at all, and how it is read back only if whole and
ours.

- one file an entry, in mlx-lm's prompt-cache format (save_prompt_cache / load_prompt_cache: safetensors) whose
  metadata says what it holds (this format's name, the model as loaded and a digest of its weights, the scope, the
  tokens, whether it can be trimmed), named by the BLAKE2b digest of its whole content;
- written under a temporary name, flushed to the disk, then renamed: a reader sees a whole file or none; a
  temporary file a killed writer left is removed once it is an hour old (another host may be writing it now);
- what a file holds is read from its safetensors header alone, so listing a folder loads no KV state; a file is
  loaded only if its content still has the digest its name says, and kept only if its metadata names the entry
  looked up.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

from worker.prefix_index import Marks, Tokens

FORMAT = "onelane-prefix-cache/2"  # (2: its images' full digests; a file of 1 is passed over)
FILE = re.compile(r"^[0-9a-f]{32}\.safetensors$")  # an entry: its content's digest
TEMPORARY = ".tmp-"
STALE_TEMPORARY_S = 3600.0
MAX_HEADER = 256 * 2**20  # a safetensors header longer than this is not ours (ours: the tokens, ~7 bytes each)

Key = tuple[str, str]  # the model as loaded and the scope (worker/prefix_cache.py)
Name = tuple[Key, Tokens]


def write_file(
    folder: Path, name: Name, cache: list[Any], trimmable: bool, most: int, marks: Marks = ()
) -> tuple[Path, int] | None:
    """Write the entry `name` (its KV state `cache`) to a file of `folder`, whole or not at all: its path and size;
    None, and nothing written, if the file would be over `most` bytes."""
    (model, scope), tokens = name
    temporary = folder / f"{TEMPORARY}{uuid.uuid4().hex}.safetensors"
    metadata = {
        "format": FORMAT,
        "model": model,
        "scope": scope,
        "tokens": ",".join(map(str, tokens)),
        "trimmable": "1" if trimmable else "0",
        "images": ",".join(f"{at}:{digest}" for at, digest in marks),
    }
    try:
        save_prompt_cache(str(temporary), cache, metadata)
        nbytes = temporary.stat().st_size
        if nbytes > most:
            return None
        with open(temporary, "rb") as f:
            os.fsync(f.fileno())
        path = folder / f"{_digest(temporary)}.safetensors"
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    _sync_folder(folder)
    return path, nbytes


def load_file(path: Path, name: Name, trimmable: bool) -> list[Any] | None:
    """The KV state in the file `path`, listed as holding the entry `name`: None if the file is torn or damaged (its
    content no longer has the digest its name says); ValueError if it holds another entry (or another error of
    reading: OSError, KeyError, TypeError, RuntimeError)."""
    if _digest(path) != path.stem:
        return None
    cache: list[Any]  # (load_prompt_cache is untyped)
    cache, metadata = load_prompt_cache(str(path), return_metadata=True)
    if identity(metadata) != (name, trimmable):
        raise ValueError("it holds another entry than its metadata said when listed")
    return cache


def list_files(folder: Path) -> dict[str, os.DirEntry[str]]:
    """The entry files in `folder`, by name; a temporary file there for over STALE_TEMPORARY_S is removed (its
    writer was killed)."""
    now, present = time.time(), {}
    for entry in os.scandir(folder):
        if FILE.match(entry.name):
            present[entry.name] = entry
        elif entry.name.startswith(TEMPORARY):
            try:
                if now - entry.stat().st_mtime > STALE_TEMPORARY_S:  # its writer was killed
                    os.unlink(entry.path)
            except OSError:
                pass
    return present


def weights_digest(model: Any) -> str:
    """A digest of a loaded model's weights that tells a model retrained in place from the one before: every
    parameter's name, shape, type, and its first and last 64 values (a pass over all the weights would cost a large
    model seconds at every load)."""
    h = hashlib.blake2b(digest_size=8)
    # (a list: mlx types tree_flatten's result as a list or a dict)
    flat_parameters = cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))
    for name, array in sorted(flat_parameters, key=lambda item: item[0]):
        flat = array.reshape(-1)
        h.update(f"{name}:{array.shape}:{array.dtype};".encode())
        h.update(memoryview(mx.concatenate([flat[:64], flat[-64:]]).astype(mx.float32)))  # type: ignore[arg-type]  # (mx.array has the buffer protocol; its stubs do not say so)
    return h.hexdigest()


def header(path: Path) -> dict[str, str]:
    """A safetensors file's metadata, read from its header alone."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size <= MAX_HEADER:
            raise ValueError("not a safetensors file")
        parsed = json.loads(f.read(size))
    metadata = parsed.get("__metadata__")
    if not isinstance(metadata, dict):
        raise ValueError("no metadata")
    # save_prompt_cache flattens [metadata, classes, scalars]: ours are the first's ("0.model", ...)
    return {k[2:]: v for k, v in metadata.items() if k.startswith("0.")}


def identity(metadata: dict[str, Any]) -> tuple[Name, bool]:
    """The entry a file's metadata names, and whether it can be trimmed; ValueError if it is not ours."""
    if metadata.get("format") != FORMAT:
        raise ValueError(f"not {FORMAT}")
    tokens = tuple(int(t) for t in str(metadata["tokens"]).split(",")) if metadata["tokens"] else ()
    if not tokens:
        raise ValueError("no tokens")
    return ((str(metadata["model"]), str(metadata["scope"])), tokens), metadata["trimmable"] == "1"


def marks_of(metadata: dict[str, Any]) -> Marks:
    """The full digests of a file's images, where each starts (none: a file of a text prompt, or an older one)."""
    listed = str(metadata.get("images") or "")
    return tuple((int(at), digest) for at, _, digest in (m.partition(":") for m in listed.split(",") if m))


def _digest(path: Path) -> str:
    """The BLAKE2b digest (128 bits, hex) of a file's whole content."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(8 * 2**20):
            h.update(chunk)
    return h.hexdigest()


def _sync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable (POSIX: the folder's entry is data of its own)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
