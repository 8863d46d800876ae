"""What a model is for, from its folder's own files as the Hugging Face hub ships them (or a models file's `kind`
where the files do not say), read without loading it: the web routes each request by it, the worker picks the loader.

- `embed`, an embedding model: sentence-transformers' `modules.json` names a Pooling module (Qwen3-Embedding,
  EmbeddingGemma), or the folder has `1_Pooling/config.json`;
- `rerank`, a cross-encoder: the config's `architectures` name a sequence classifier (`…ForSequenceClassification`);
- `generate`, anything else: a text generator, loaded by mlx_lm.load; one whose config has a `vision_config`
  (`reads_images`) is a vision-language model, loaded by mlx-vlm, whose prompts may hold images.

An embedding model and a reranker run no decode steps: their jobs are read in one forward pass each, beside the
batch (worker/pooling.py), never in it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Literal

Kind = Literal["generate", "embed", "rerank"]
KINDS: tuple[Kind, ...] = ("generate", "embed", "rerank")
#: what each kind is called in a message
NAMES: dict[Kind, str] = {"generate": "a text generator", "embed": "an embedding model", "rerank": "a reranker"}


def kind_of(folder: str) -> Kind:
    """The kind of the model in `folder` (a path that is no folder, such as a hub id not fetched: `generate`)."""
    return _kind_of(str(Path(folder).resolve()))


@lru_cache(maxsize=256)
def _kind_of(folder: str) -> Kind:
    path = Path(folder)
    if not path.is_dir():
        return "generate"
    modules = _read(path / "modules.json")
    if (isinstance(modules, list) and any(_pools(m) for m in modules)) or (
        path / "1_Pooling" / "config.json"
    ).is_file():
        return "embed"
    config = _read(path / "config.json")
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if isinstance(architectures, list) and any(str(a).endswith("ForSequenceClassification") for a in architectures):
        return "rerank"
    return "generate"


def reads_images(folder: str) -> bool:
    """Whether the model in `folder` is a vision-language model (its config.json has a `vision_config`)."""
    return _reads_images(str(Path(folder).resolve()))


@lru_cache(maxsize=256)
def _reads_images(folder: str) -> bool:
    config = _read(Path(folder) / "config.json")
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)


def _pools(module: object) -> bool:
    return isinstance(module, dict) and str(module.get("type", "")).endswith(".Pooling")


def _read(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
