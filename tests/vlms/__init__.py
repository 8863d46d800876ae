"""The corpus of tiny vision-language folders: one module per family (tests/vlms/<family>.py), each naming the
mlx-vlm architectures it builds in `ARCHS` (model_type -> a builder writing a folder that `mlx_vlm.load` reads
offline and with which `mlx_vlm.generate` answers about an image). This package collects them all, so that a test
(tests/test_vision_archs.py) can go over every architecture the corpus holds without naming the modules."""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Callable
from pathlib import Path

Builder = Callable[[Path], object]


def _collect() -> dict[str, Builder]:
    found: dict[str, Builder] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for arch, builder in getattr(module, "ARCHS", {}).items():
            if arch in found:
                raise ValueError(f"two modules of tests/vlms build {arch}: {info.name} and another")
            found[arch] = builder
    return found


#: every architecture of the corpus, by mlx-vlm model_type
ARCHS: dict[str, Builder] = _collect()


def names() -> list[str]:
    """The corpus's architectures, in order; those named in $ONELANE_VLMS (comma-separated) where it is set, to try
    a few while working on them."""
    only = {a for a in os.environ.get("ONELANE_VLMS", "").split(",") if a}
    unknown = only - set(ARCHS)
    if unknown:
        raise ValueError(f"ONELANE_VLMS names architectures the corpus lacks: {sorted(unknown)}")
    return sorted(a for a in ARCHS if not only or a in only)


def build(arch: str, folder: Path) -> Path:
    """Write `arch`'s tiny folder into `folder`; returns it."""
    ARCHS[arch](folder)
    return folder
