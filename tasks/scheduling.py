"""The rules the worker schedules by, written once: the worker plays them (worker/batch/), claim.lua reads the
look-ahead as a constant written into it (tasks/scripts.py), and the ETA replays them (tasks/eta.py), so a forecast
cannot drift from what the worker does.

- How far a claim looks into the fair order for a job that may go ahead of the head (`LOOK_AHEAD`).
- Whether a job fits beside the batch's runs: the KV cache the batch may come to hold, each run padded to the
  longest (`kv_tokens`), within the budget.
- Which batch-class runs preemption sets aside for an interactive job: the cheapest first (the fewest KV tokens to
  keep and read again), as few as make room (`set_aside`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

LOOK_AHEAD = 64  # how many jobs of the fair order a claim looks through for one that may run now

T = TypeVar("T")


def kv_tokens(costs: Iterable[int | float]) -> float:
    """The KV cache, in tokens, a batch of runs that may each come to hold `costs` tokens (prompt + max_tokens)
    may hold at once: mlx-lm's batched caches pad every row to the longest."""
    held = list(costs)
    return len(held) * max(held, default=0)


def fits(cost: int | float, costs: Iterable[int | float], budget: int) -> bool:
    """Whether a job of `cost` tokens joins runs of `costs` within the KV budget (a batch of none takes any)."""
    held = list(costs)
    return not held or kv_tokens([cost, *held]) <= budget


def set_aside(runs: Iterable[T], held: Callable[[T], float], room: Callable[[Sequence[T]], bool]) -> list[T] | None:
    """The fewest of `runs` (those that may be set aside), taken cheapest first (the fewest tokens `held`: their KV
    state, to keep and to read again), whose leaving makes `room` (none, if there is room already); None if even
    all of them would not."""
    cheapest_first = sorted(runs, key=held)
    for n in range(len(cheapest_first) + 1):
        if room(cheapest_first[:n]):
            return cheapest_first[:n]
    return None
