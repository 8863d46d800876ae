"""LLM-jp VL (`llmjpvl`, as llm-jp's InternVL-style vision-language models ship it) has no tiny folder that answers
about an image: mlx-vlm 0.7.10 has no processor for it (no processing module, no ImageProcessor in its model's
module: the hub's processor is remote code), so offline its processor is the bare tokenizer, which writes no image
tokens, while its model puts each tile's features in place of as many <IMG_CONTEXT> tokens (and raises when they
are not as many)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.vlms.folder import Unbuildable


def build_llmjpvl(folder: Path) -> Path:
    """Raises Unbuildable (see the module's docstring)."""
    raise Unbuildable("mlx-vlm has no processor for it (the hub's is remote code): no offline folder reads an image")


ARCHS: dict[str, Callable[[Path], Path]] = {"llmjpvl": build_llmjpvl}
