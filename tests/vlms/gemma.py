"""Gemma 3 (`gemma3`): tests/tiny_vision.py's folder, in the corpus (its docstring says how it is built)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.tiny_vision import build_gemma3

ARCHS: dict[str, Callable[[Path], Path]] = {"gemma3": build_gemma3}
