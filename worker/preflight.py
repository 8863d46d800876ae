"""What a worker can tell of its served models as it starts, before any job asks for one: a local folder whose
architecture the installed mlx-lm (or mlx-vlm, for a model that reads images) does not know cannot load, whatever
its weights. It is recorded as failed at once (worker/models.py `failed`: the log's one line, /readyz's models, and
admission's 503 naming it), not found by the first user who asks for it. Nothing is read but config.json: a folder
that passes may still fail at its load, which says why then."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasks.catalogue import ModelConfig
from worker.unsupported import Unsupported


def unknown_architecture(config: ModelConfig) -> Unsupported | None:
    """Why `config`'s folder cannot load, if its config names an architecture the library that loads it lacks."""
    if config.kind != "generate" or config.gguf:
        return None
    found = Path(config.path) / "config.json"
    try:
        read = json.loads(found.read_text()) if found.is_file() else None
    except (OSError, ValueError):
        return None  # (an unreadable config: its load says why)
    if not isinstance(read, dict) or not isinstance(read.get("model_type"), str) or "model_file" in read:
        return None  # (no architecture named, or the folder brings its own code: its load says)
    library, known = ("mlx-vlm", _vlm_knows) if config.vision else ("mlx-lm", _lm_knows)
    if known(read):
        return None
    return Unsupported(f"its architecture {read['model_type']!r} is not one the installed {library} knows")


def _lm_knows(config: dict[str, Any]) -> bool:
    from mlx_lm.utils import _get_classes  # (what mlx_lm.load resolves the architecture with)

    try:
        _get_classes(config)
    except ValueError:
        return False
    return True


def _vlm_knows(config: dict[str, Any]) -> bool:
    from mlx_vlm.utils import get_model_and_args  # (what mlx_vlm.load resolves it with)

    try:
        get_model_and_args({"model_type": config["model_type"]})
    except (ImportError, ValueError, KeyError):
        return False
    return True
