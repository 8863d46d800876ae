"""Moondream 2 and 3 (`moondream2`, `moondream3`) have no folder here: mlx-vlm's processors for them load their
tokenizer from the hub (moondream/starmie-v1) whatever the folder holds, so no offline folder loads. (Their image
features also take the places after the prompt's first token, not those of an image token their config names.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.vlms.folder import Unbuildable


def build_moondream(folder: Path) -> Path:
    """Raises Unbuildable (see the module's docstring)."""
    raise Unbuildable("its processor loads its tokenizer from the hub (moondream/starmie-v1): no offline folder loads")


ARCHS: dict[str, Callable[[Path], Path]] = {"moondream2": build_moondream, "moondream3": build_moondream}
