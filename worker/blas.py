"""Preload Debian's OpenBLAS into the worker: on Linux, MLX's CPU build bundles a slow reference BLAS, and OpenBLAS
(same results) makes matrix products many times faster. LD_PRELOAD takes effect only from a process's start, so the
supervisor sets it for the worker processes it starts, and a worker started otherwise starts itself again with it.
ONELANE_OPENBLAS=false turns it off (bench/blas.py measures the effect)."""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Mapping

from tasks.settings import Settings

CANDIDATES = (
    "/usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/*-linux-gnu/libopenblas.so.0",
)


def openblas_path() -> str | None:
    """The OpenBLAS library on this machine, or None (not Linux, or not installed)."""
    if not sys.platform.startswith("linux"):
        return None
    for pattern in CANDIDATES:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def worker_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env`, the environment of a worker about to start, with OpenBLAS preloaded when it is installed, the worker's
    settings (read from `env`, as the worker will read them) allow it, and nothing else is preloaded already."""
    library = openblas_path()
    if library is None or env.get("LD_PRELOAD") or not Settings.from_env(env).openblas:
        return dict(env)
    return {**env, "LD_PRELOAD": library}


def preload_openblas() -> None:
    """Start this same command again with OpenBLAS preloaded, when worker_env would preload it and it is not yet."""
    env = worker_env(os.environ)
    if env.get("LD_PRELOAD") != os.environ.get("LD_PRELOAD"):
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)  # the same command, again
