"""What only the worker sees of a job's way to its first token, and of each step, for a benchmark to read
(bench/profile_queue.py). Off (None) unless a benchmark turns it on (`record`): a worker then pays one `is None`
test per join, per output write, and three per step, nothing else."""

from __future__ import annotations

import time
from collections.abc import Callable

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


def clock() -> float:
    """Now (time.time()), when recording is on: when a step begins."""
    return time.time() if steps is not None else 0.0


def stepped(began: float, sequences: int, prefill: int, jobs: Callable[[], list[str]]) -> None:
    """The engine's step, begun at `began`, is done: `sequences` got a token, `prefill` prompt tokens were read, and
    `jobs()` (called only when recording) made a token in it (each job's first is its first token)."""
    if steps is None:
        return
    done = time.time()
    steps.append([began, done, done, sequences, prefill])
    for job_id in jobs():
        mark(job_id, "first_token", done)


def step_ended() -> None:
    """The step's output and endings are handed over: its end."""
    if steps is not None and steps:
        steps[-1][2] = time.time()
