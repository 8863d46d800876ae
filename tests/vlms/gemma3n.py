"""Gemma 3n (`gemma3n`, as google/gemma-3n-E2B-it ships it) has no tiny folder: mlx-vlm's builds its MobileNetV5
vision tower from the block list of its vision.py (`gemma3n_mobilenet_def`: four stages of up to 37 blocks, 128 to
1,280 channels, a 2,048-wide fusion adapter: ~300 M parameters), whatever the config says, so the smallest tower
mlx-vlm builds is the real one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.vlms.folder import Unbuildable


def build_gemma3n(folder: Path) -> Path:
    """Raises Unbuildable (see the module's docstring)."""
    raise Unbuildable("its MobileNetV5 tower's blocks are constants of mlx-vlm's vision.py (~300 M parameters)")


ARCHS: dict[str, Callable[[Path], Path]] = {"gemma3n": build_gemma3n}
