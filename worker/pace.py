"""How fast the device goes, per model, as measured on its own steps: what ETAs are computed from (tasks/eta.py).

A batch step's wall time, from its start to the next one's (as the loop lives it), is fitted as
`a + b × n + p × prefill`: a fixed cost (the weights read once a step), a cost per generating sequence, and a cost
per prompt token read in that step (as the device pays for them: prompts read side by side are padded to the
longest chunk). Least squares over the model's last
WINDOW steps, with a few pseudo-steps of a prior so that a batch that never changed size still gives a sensible
split of its time between `a` and `b` (the prior gives way as soon as real steps vary).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

WINDOW = 1024  # steps per model
PRIOR_STEPS = 4.0  # the weight of the prior, in steps
FIXED_SHARE = 8.0  # the prior: a step's fixed cost is this many sequences' worth ...
PREFILL_SHARE = 0.4  # ... and a prompt token this share of a sequence's (both as SmolLM2-135M measured on 2 CPU cores:
#                      74 ms a step, 9 ms a sequence, 3.5 ms a prompt token)


@dataclass(frozen=True)
class Speed:
    """A model's measured pace on this device (seconds): a step's fixed cost, per sequence, per prompt token."""

    step_s: float
    per_sequence_s: float
    per_prompt_token_s: float

    def as_list(self) -> list[float]:
        return [round(self.step_s, 6), round(self.per_sequence_s, 6), round(self.per_prompt_token_s, 7)]


class Pace:
    """The worker's measurements; `observe` is called by the loop after every step, `speeds` by the heartbeat."""

    def __init__(self) -> None:
        self._steps: dict[str, deque[tuple[int, int, float]]] = {}

    def observe(self, model: str, sequences: int, prompt_tokens: int, seconds: float) -> None:
        """One step of `model`'s batch: `sequences` generated a token, `prompt_tokens` were read, in `seconds`."""
        if sequences or prompt_tokens:
            self._steps.setdefault(model, deque(maxlen=WINDOW)).append((sequences, prompt_tokens, seconds))

    def speeds(self) -> dict[str, Speed]:
        """Each measured model's fitted pace (the window is copied first: the loop appends meanwhile)."""
        return {model: fit(list(steps)) for model, steps in list(self._steps.items()) if steps}


def fit(steps: list[tuple[int, int, float]]) -> Speed:
    """The least-squares `a + b n + p prefill` of `steps` (n, prefill, seconds), with the prior's pseudo-steps."""
    data = np.array(steps, dtype=np.float64)
    n, prefill, seconds = data[:, 0], data[:, 1], data[:, 2]
    # the prior, scaled to these steps: their mean time split as if a step's fixed cost were FIXED_SHARE sequences'
    # and a prompt token PREFILL_SHARE of one; three pseudo-steps of it: one sequence, sixteen, a prompt chunk
    b0 = float(seconds.mean()) / (FIXED_SHARE + float(n.mean()) + PREFILL_SHARE * float(prefill.mean()))
    prior = np.array([[1.0, 1.0, 0.0], [1.0, 16.0, 0.0], [1.0, 0.0, 128.0]])
    prior_s = prior @ np.array([FIXED_SHARE * b0, b0, PREFILL_SHARE * b0])
    rows = np.vstack([np.column_stack([np.ones_like(n), n, prefill]), prior])
    targets = np.concatenate([seconds, prior_s])
    weights = np.sqrt(np.concatenate([np.ones(len(steps)), np.full(len(prior), PRIOR_STEPS / len(prior))]))
    (a, b, p), *_ = np.linalg.lstsq(rows * weights[:, None], targets * weights, rcond=None)
    return Speed(max(float(a), 0.0), max(float(b), 0.0), max(float(p), 0.0))  # a cost is never negative
