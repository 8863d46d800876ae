"""Shared set-up for benchmarks: a private redis-server and the demo model, in a temp folder."""

from __future__ import annotations

import statistics
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tasks.embedded_redis import EmbeddedRedis
from tasks.settings import Settings


@contextmanager
def bench_env(size: str = "tiny", **overrides: object) -> Iterator[Settings]:
    """A fresh Redis (unix socket) and a demo model of `size`; yields Settings pointing at both."""
    from worker.demo_model import make_demo_model

    with tempfile.TemporaryDirectory(prefix="onelane-bench-") as tmp:
        folder = Path(tmp)
        server = EmbeddedRedis(folder / "redis", appendonly=False).start()
        try:
            model = make_demo_model(folder / f"model-{size}", size=size)
            yield Settings(redis_url=server.url, model=str(model), var_dir=folder, **overrides)  # type: ignore[arg-type]
        finally:
            server.stop()


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it is still there after `timeout_s`."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def summary(values: list[float], unit: str = "ms", scale: float = 1000.0) -> str:
    return (
        f"p50 {pct(values, 50) * scale:.2f} {unit}, p99 {pct(values, 99) * scale:.2f} {unit}, "
        f"mean {statistics.fmean(values) * scale:.2f} {unit} (n={len(values)})"
    )
