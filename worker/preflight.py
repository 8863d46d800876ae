"""What a worker can tell of its served models as it starts, before any job asks for one: a local folder whose
architecture the installed mlx-lm (or mlx-vlm, for a model that reads images) does not know cannot load, whatever
its weights. It is recorded as failed at once (worker/models.py `failed`: the log's one line, /readyz's models, and
admission's 503 naming it), not found by the first user who asks for it. Nothing is read but config.json: a folder
that passes may still fail at its load, which says why then."""

from __future__ import annotations

import json
from pathlib import Path

from tasks.catalogue import ModelConfig
from worker.unsupported import Unsupported


def unknown_architecture(config: ModelConfig) -> Unsupported | None:
    """Why `config`'s folder cannot load, if its config names an architecture the library that loads it lacks."""
    if config.kind != "generate" or config.gguf:
        return None
    found = Path(config.path) / "config.json"
    try:
        model_type = json.loads(found.read_text()).get("model_type") if found.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None  # (an unreadable config: its load says why)
    if not isinstance(model_type, str):
        return None
    library, known = ("mlx-vlm", _vlm_knows) if config.vision else ("mlx-lm", _lm_knows)
    if known(model_type):
        return None
    return Unsupported(f"its architecture {model_type!r} is not one the installed {library} knows")


def _lm_knows(model_type: str) -> bool:
    import importlib

    from mlx_lm.utils import MODEL_REMAPPING

    try:
        importlib.import_module(f"mlx_lm.models.{MODEL_REMAPPING.get(model_type, model_type)}")
    except ImportError:
        return False
    return True


def _vlm_knows(model_type: str) -> bool:
    from mlx_vlm.utils import get_model_and_args

    try:
        get_model_and_args({"model_type": model_type})
    except (ImportError, ValueError, KeyError):
        return False
    return True
