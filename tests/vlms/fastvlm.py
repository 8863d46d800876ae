"""FastVLM (`fastvlm`, as apple/FastVLM-0.5B ships it) has no tiny folder: its FastViTHD tower's sizes (five stages
of 2, 12, 24, 4, 2 layers, 96 to 1,536 wide: ~125 M parameters) are class attributes of mlx-vlm's VisionConfig, not
fields a config.json sets, so the smallest tower mlx-vlm builds is the real one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.vlms.folder import Unbuildable


def build_fastvlm(folder: Path) -> Path:
    """Raises Unbuildable (see the module's docstring)."""
    raise Unbuildable(
        "its FastViTHD tower's sizes are fixed in mlx-vlm's VisionConfig (class attributes, ~125 M parameters): "
        "no tiny config builds"
    )


ARCHS: dict[str, Callable[[Path], Path]] = {"fastvlm": build_fastvlm}
