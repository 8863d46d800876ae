"""Phi-3 Vision (`phi3_v`, as microsoft/Phi-3.5-vision-instruct ships it) has no tiny folder: mlx-vlm's builds its
image encoder as CLIP ViT-L/14-336 whatever the config says (its sizes are constants of its vision.py: 24 layers of
1,024, 300 M parameters), and its processor cuts images into 336-pixel crops. (Its processor also writes an image's
tokens as negative ids, -1 for the first image, not as a token its config names.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.vlms.folder import Unbuildable


def build_phi3_v(folder: Path) -> Path:
    """Raises Unbuildable (see the module's docstring)."""
    raise Unbuildable("its image encoder is CLIP ViT-L/14-336 whatever the config says (300 M parameters)")


ARCHS: dict[str, Callable[[Path], Path]] = {"phi3_v": build_phi3_v}
