"""Find Debian's OpenBLAS: on Linux, MLX's CPU build bundles a slow reference BLAS, and preloading OpenBLAS
(same results) makes matrix products many times faster. It must be set before the process starts, so the
supervisor sets LD_PRELOAD for the worker processes it starts (bench/blas.py measures the effect)."""

from __future__ import annotations

import glob
import os
import sys

CANDIDATES = (
    "/usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/*-linux-gnu/libopenblas.so.0",
)


def openblas_path() -> str | None:
    """The OpenBLAS library to preload, or None (not Linux, not installed, or ONELANE_OPENBLAS=0)."""
    if not sys.platform.startswith("linux") or os.environ.get("ONELANE_OPENBLAS", "1") == "0":
        return None
    for pattern in CANDIDATES:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def worker_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with OpenBLAS preloaded when available and nothing else is preloaded already."""
    library = openblas_path()
    if library is None or env.get("LD_PRELOAD"):
        return env
    return {**env, "LD_PRELOAD": library}
