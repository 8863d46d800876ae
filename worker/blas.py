"""Preload Debian's OpenBLAS into the worker: on Linux, MLX's CPU build bundles a slow reference BLAS, and OpenBLAS
(same results) makes matrix products many times faster. LD_PRELOAD takes effect only from a process's start, so the
supervisor sets it for the worker processes it starts, and a worker started otherwise starts itself again with it.
ONELANE_OPENBLAS=false turns it off (bench/blas.py measures the effect).

Ahead of OpenBLAS goes worker/gemv_forward.c, built here with the system's C compiler into ONELANE_VAR_DIR/lib on
first use: it sends products of 1 to 4 rows (a decode step of 1 to 4 sequences) to OpenBLAS's matrix-vector routine,
which this OpenBLAS's sgemm does not do (see the C file). ONELANE_GEMV=false, or no compiler, leaves it out.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tasks.settings import Settings

logger = logging.getLogger(__name__)
GEMV_SOURCE = Path(__file__).with_name("gemv_forward.c")

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


def gemv_library(var_dir: Path) -> str | None:
    """worker/gemv_forward.c built into `var_dir`/lib (once per version of the source), or None where no C compiler
    is found or the build fails (then the worker goes without it, and says so)."""
    source = GEMV_SOURCE.read_bytes()
    target = var_dir.resolve() / "lib" / f"gemv_forward-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if target.exists():
        return str(target)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        logger.info("no C compiler (cc): products of 1 to 4 rows go through OpenBLAS's sgemm (a slower decode)")
        return None
    building = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        built = subprocess.run(
            [compiler, "-O2", "-shared", "-fPIC", "-o", str(building), str(GEMV_SOURCE), "-ldl"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if built.returncode != 0:
            logger.warning("could not build %s, going without it: %s", GEMV_SOURCE.name, built.stderr.strip()[-500:])
            return None
        os.replace(building, target)  # whole, or not at all: another process may be building it too
        for old in target.parent.glob("gemv_forward-*.so"):  # earlier versions' (a process using one keeps it)
            if old != target:
                old.unlink(missing_ok=True)
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("could not build %s, going without it: %s", GEMV_SOURCE.name, exc)
        return None
    finally:
        building.unlink(missing_ok=True)
    return str(target)


def worker_env(env: Mapping[str, str], gemv: bool = True) -> dict[str, str]:
    """`env`, the environment of a worker about to start, with OpenBLAS preloaded when it is installed, the worker's
    settings (read from `env`, as the worker will read them) allow it, and nothing else is preloaded already; ahead
    of it the one-row shim (gemv_library), unless `gemv` is False or the settings turn it off."""
    library = openblas_path()
    if library is None or env.get("LD_PRELOAD"):
        return dict(env)
    settings = Settings.from_env(env)
    if not settings.openblas:
        return dict(env)
    shim = gemv_library(settings.var_dir) if gemv and settings.gemv else None
    return {**env, "LD_PRELOAD": f"{shim} {library}" if shim else library}


def preload_openblas() -> None:
    """Start this same command again with OpenBLAS preloaded, when worker_env would preload it and it is not yet."""
    env = worker_env(os.environ)
    if env.get("LD_PRELOAD") != os.environ.get("LD_PRELOAD"):
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)  # the same command, again
