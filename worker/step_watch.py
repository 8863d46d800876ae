"""How long the step on the device may run before the supervisor takes it for a hang: a model that cannot make
progress (a forward pass that never returns) fails its jobs in seconds, not after ONELANE_STALL_S.

The runner starts the watch before each step of the batch with what the step should take: its model's measured pace
(worker/pace.py) for the batch's sequences and the most prompt tokens the step can read. The heartbeat reports how
long the step has run and its limit, TIMES that much but at least FLOOR_S (a first pass at a new shape may compile
kernels; a shared machine stalls every process now and then, for over 2 s here); stall.lua, run by the supervisor
every round, ends the holder's jobs as `stalled` once its heartbeat says the step has run past it, and the
supervisor kills the worker. Only a live heartbeat says so: a frozen worker's lease lapses first, and its jobs are
handed back. A model with no pace yet has no limit but ONELANE_STALL_S (default 120 s), which bounds every step.
"""

from __future__ import annotations

import time

from tasks.eta import Speed

FLOOR_S = 15.0
TIMES = 10.0


class StepWatch:
    """The step now on the device: when it began and how long it may run (written by the runner's thread, read by
    the heartbeat's: two plain attributes, each written whole)."""

    def __init__(self) -> None:
        self._step: tuple[float, float] | None = None  # (began, limit_s), monotonic

    def start(self, speed: Speed | None, sequences: int, prompt_tokens: int) -> None:
        """A step begins: `sequences` in the batch, at most `prompt_tokens` to read."""
        if speed is None:
            self._step = (time.monotonic(), 0.0)
            return
        expected = speed.step_s + speed.per_sequence_s * sequences + speed.per_prompt_token_s * prompt_tokens
        self._step = (time.monotonic(), max(FLOOR_S, TIMES * expected))

    def stop(self) -> None:
        self._step = None

    def report(self) -> tuple[float, float]:
        """How long the step now on the device has run and may run (0, 0: none runs)."""
        step = self._step
        if step is None:
            return 0.0, 0.0
        began, limit_s = step
        return max(time.monotonic() - began, 1e-3), limit_s
