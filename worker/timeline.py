"""What only the worker sees of a job's way to its first token, and of each step, for a benchmark to read
(bench/profile_queue.py). Off (None) unless a benchmark turns it on (`record`): a worker then pays one `is None`
test per join, per step and per output write, nothing else."""

from __future__ import annotations

import time

# job id -> point ("joined" the engine, "first_token" out of a step, its first tokens "sent" to Redis and "written")
# -> time.time(), each point's first time only
marks: dict[str, dict[str, float]] | None = None
# per step, time.time(): [began, the engine's step done, ended, sequences that got a token, prompt tokens read]
steps: list[list[float]] | None = None


def record() -> None:
    """Turn recording on in this process (a worker's, or a benchmark's that runs one)."""
    global marks, steps
    marks, steps = {}, []


def mark(job_id: str, point: str, at: float | None = None) -> None:
    """`job_id` reached `point` now (or `at`), unless it did before; nothing when recording is off."""
    if marks is not None:
        marks.setdefault(job_id, {}).setdefault(point, time.time() if at is None else at)
