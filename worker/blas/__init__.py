"""Preload Debian's OpenBLAS into the worker: on Linux, MLX's CPU build bundles a slow reference BLAS, and OpenBLAS
(same results) makes matrix products many times faster. LD_PRELOAD takes effect only from a process's start, so the
supervisor sets it for the worker processes it starts, and a worker started otherwise starts itself again with it.
ONELANE_OPENBLAS=false turns it off (bench/blas.py measures the effect).

Ahead of OpenBLAS goes worker/blas/shim.c, built here with the system's C compiler into ONELANE_VAR_DIR/lib on
first use. It keeps a fork() from stopping OpenBLAS's threads under a product that is under way (which leaves the
product waiting for ever), and it multiplies every product (a decode step, a step verifying a few tokens of each
sequence, a prompt's chunk) with a kernel of its own, which reads each weight once for up to 64 rows (this OpenBLAS's
sgemm copies every weight matrix first, and its matrix-vector routine reads it again for every row), shares the work
between both cores as it goes (OpenBLAS's fixed shares stall beside other busy processes: a prompt took up to 18 times
as long, bench/busy_cpu.py) and sums each element the same way whatever the rows; ONELANE_GEMV=false leaves the
products to OpenBLAS. See the C file. Without a compiler the worker goes without the shim, and says so.
"""

from __future__ import annotations

import ctypes
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
SHIM_SOURCE = Path(__file__).with_name("shim.c")
SHIM_PREFIX = "blas_shim-"

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


def shim_library(var_dir: Path) -> str | None:
    """worker/blas/shim.c built into `var_dir`/lib (once per version of the source), or None where no C compiler
    is found or the build fails (then the worker goes without it, and says so)."""
    source = SHIM_SOURCE.read_bytes()
    target = var_dir.resolve() / "lib" / f"{SHIM_PREFIX}{hashlib.sha256(source).hexdigest()[:12]}.so"
    if target.exists():
        return str(target)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        logger.warning(
            "no C compiler (cc): going without worker/blas/shim.c (a slower decode, and a fork() in the worker "
            "may stop a product for ever)"
        )
        return None
    building = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        built = subprocess.run(  # no contraction into FMAs: the kernel's sums are to be the same in every copy of it
            [
                compiler,
                "-O2",
                "-ffp-contract=off",
                "-shared",
                "-fPIC",
                "-o",
                str(building),
                str(SHIM_SOURCE),
                "-ldl",
                "-lpthread",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if built.returncode != 0:
            logger.warning("could not build %s, going without it: %s", SHIM_SOURCE.name, built.stderr.strip()[-500:])
            return None
        os.replace(building, target)  # whole, or not at all: another process may be building it too
        for old in target.parent.glob(f"{SHIM_PREFIX}*.so"):  # earlier versions' (a process using one keeps it)
            if old != target:
                old.unlink(missing_ok=True)
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("could not build %s, going without it: %s", SHIM_SOURCE.name, exc)
        return None
    finally:
        building.unlink(missing_ok=True)
    return str(target)


def worker_env(env: Mapping[str, str], shim: bool = True) -> dict[str, str]:
    """`env`, the environment of a worker about to start, with OpenBLAS preloaded when it is installed, the worker's
    settings (read from `env`, as the worker will read them) allow it, and nothing else is preloaded already; ahead
    of it the shim (shim_library), unless `shim` is False (mlx_lm.server in the benchmarks runs without it)."""
    library = openblas_path()
    if library is None or env.get("LD_PRELOAD"):
        return dict(env)
    settings = Settings.from_env(env)
    if not settings.openblas:
        return dict(env)
    built = shim_library(settings.var_dir) if shim else None
    return {**env, "LD_PRELOAD": f"{built} {library}" if built else library}


def preload_openblas(settings: Settings | None = None) -> None:
    """Start this same command again with OpenBLAS preloaded, when worker_env would preload it and it is not yet;
    then tell the shim, when it is loaded, whether to multiply products itself (`settings.gemv`) and between how many
    threads (`settings.gemv_threads`), of the environment's settings when none are given."""
    env = worker_env(os.environ)
    if env.get("LD_PRELOAD") != os.environ.get("LD_PRELOAD"):
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)  # the same command, again
    shim = loaded_shim()
    if shim is None:
        return
    settings = settings or Settings.from_env()
    if not settings.gemv:
        ctypes.c_int.in_dll(shim, "onelane_gemv_max_rows").value = 0
    ctypes.c_int.in_dll(shim, "onelane_threads").value = settings.gemv_threads


def loaded_shim() -> ctypes.CDLL | None:
    """The shim preloaded into this process (to set its knobs), or None."""
    shims = [p for p in os.environ.get("LD_PRELOAD", "").split() if Path(p).name.startswith(SHIM_PREFIX)]
    return ctypes.CDLL(shims[0]) if shims else None
