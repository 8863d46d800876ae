"""DeepSeek-OCR (`deepseekocr`, deepseek-ai/DeepSeek-OCR) and DeepSeek-OCR 2 (`deepseekocr_2`) have no tiny folder:
mlx-vlm builds their SAM image encoder as SAM ViT-B whatever the config says (`SAMViTConfig()`'s defaults, constants
of its code: 12 layers of 768 over 1,024-pixel images, 90 M parameters), and their processor reads every image as a
1,024-pixel global view (and 640-pixel tiles)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.vlms.folder import Unbuildable

WHY = "its SAM image encoder is SAM ViT-B (12 layers of 768, 1,024-pixel images) whatever the config says"


def build_deepseek_ocr(folder: Path) -> Path:
    """Raises Unbuildable (see the module's docstring)."""
    raise Unbuildable(WHY)


ARCHS: dict[str, Callable[[Path], Path]] = {"deepseekocr": build_deepseek_ocr, "deepseekocr_2": build_deepseek_ocr}
