"""Idefics 3 (`idefics3`, SmolVLM's layout): tests/tiny_vision.py's folder, in the corpus (its docstring says how it
is built)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.tiny_vision import build_idefics3

ARCHS: dict[str, Callable[[Path], Path]] = {"idefics3": build_idefics3}
