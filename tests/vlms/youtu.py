"""Youtu-VL (`youtu_vl`, tencent/Youtu-VL-4B-Instruct) has no tiny folder mlx-vlm answers with: its processor (a
Siglip2 image processor writing `spatial_shapes` and patches in its merger's order) is the hub's own code
(`YoutuVLProcessor`, loaded with trust_remote_code), which neither mlx-vlm nor transformers ships; offline, mlx-vlm
cannot load it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.vlms.folder import Unbuildable


def build_youtu_vl(folder: Path) -> Path:
    """Raises Unbuildable (see the module's docstring)."""
    raise Unbuildable("its processor is the hub's own code (YoutuVLProcessor), which mlx-vlm does not ship")


ARCHS: dict[str, Callable[[Path], Path]] = {"youtu_vl": build_youtu_vl}
