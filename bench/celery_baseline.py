"""Baseline: Celery 5 with the solo pool on a private Redis, running the same no-op job body as onelane.

Two figures: pickup latency on an idle worker (task start - send time, ~50 ms apart so the worker is
idle each time) and the gap between back-to-back jobs (start-to-start of a backlog drained at once).
Run: .venv/bin/python -m bench.celery_baseline [--n 200]
"""

from __future__ import annotations

import argparse
import os

import celery

from bench import celery_app
from bench.harness import private_redis
from bench.report import summary


def main() -> None:
    """Run both figures on a fresh private Redis and print them."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200, help="samples per figure")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with private_redis() as (_, url):
        figures = celery_app.run(url, args.n)
    drain = figures["drain"][0]
    print(
        f"celery {celery.__version__}, solo pool, Redis on a unix socket, no-op job body; "
        f"load average {load:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(f"celery solo: pickup (idle worker) {summary(figures['pickup'])}")
    print(f"celery solo: back-to-back gap {summary(figures['gap'])}")
    print(f"celery solo: drained {args.n} queued jobs in {drain * 1000:.1f} ms ({(args.n - 1) / drain:.0f} jobs/s)")


if __name__ == "__main__":
    main()
