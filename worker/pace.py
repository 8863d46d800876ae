"""How fast the device goes, per model, as measured on its own steps: what ETAs are computed from (tasks/eta.py).

A batch step's wall time, from its start to the next one's (as the loop lives it), is fitted as
`a + b × n + p × prefill`: a fixed cost (the weights read once a step), a cost per generating sequence, and a cost
per prompt token read in that step (as the device pays for them: prompts read side by side are padded to the
longest chunk). Least squares over the model's last
WINDOW steps, with a few pseudo-steps of a prior so that a batch that never changed size still gives a sensible
split of its time between `a` and `b` (the prior gives way as soon as real steps vary).

A model is timed as it loads, before any job (`probe`): a few decode steps of one sequence and of a full batch, and
a prompt read beside them, on a batch of its own. Those steps open the model's window, so the first ETAs a fresh
worker gives come from its device as it is, not from a guess; the loop's own steps soon outnumber them.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque

import mlx.nn as nn
import numpy as np
from mlx_lm.sample_utils import greedy_sampler

from tasks.eta import Speed
from tasks.settings import PREFILL_BATCH
from worker.batch.forward import ContinuousBatch
from worker.batch.rows import Batching

WINDOW = 1024  # steps per model
TOKENS_WINDOW = 256  # the loop's last steps whose tokens a sequence got a step are counted (it follows the work)
REFIT = 64  # steps between two fits of a model's pace for the loop's own use (worker/step_watch.py)
PRIOR_STEPS = 4.0  # the weight of the prior, in steps
FIXED_SHARE = 8.0  # the prior: a step's fixed cost is this many sequences' worth ...
PREFILL_SHARE = 0.4  # ... and a prompt token this share of a sequence's (both as SmolLM2-135M measured on 2 CPU cores:
#                      74 ms a step, 9 ms a sequence, 3.5 ms a prompt token)
PROBE_STEPS = 4  # decode steps timed at each batch size as a model loads ...
PROBE_LEAST_S = 0.1  # ... more until they took this long (a small model's steps of a millisecond are noisy) ...
PROBE_S = 0.4  # ... fewer (2 at least) once they took this long (a big batch on a slow device)
PROBE_MOST = 200
PROBE_PROMPT = 64  # tokens of the prompt whose reading is timed
PROBE_FILL_S = 1.5  # no more sequences join the probe's batch after this long (a batch of 256 on a CPU)
LONG = 1 << 20  # the probe's sequences' max_tokens: none ends by itself

Step = tuple[int, int, float]  # sequences that generated a token, prompt tokens read (padded), seconds


class Pace:
    """The worker's measurements; `observe` is called by the loop after every step, `speeds` by the heartbeat."""

    def __init__(self) -> None:
        self._steps: dict[str, deque[Step]] = {}
        # per model, each step's sequences and tokens (more than one a sequence where it kept proposals)
        self._tokens: dict[str, deque[tuple[int, int]]] = {}
        self._observed: dict[str, int] = {}  # steps seen per model, ever
        self._fitted: dict[str, tuple[int, Speed]] = {}  # per model: its fit, and how many steps it had seen

    def observe(
        self, model: str, sequences: int, prompt_tokens: int, seconds: float, tokens: int | None = None
    ) -> None:
        """One step of `model`'s batch: `sequences` generated `tokens` (one each, unless they kept proposals:
        worker/batch/speculation.py), `prompt_tokens` were read, in `seconds`."""
        if sequences or prompt_tokens:
            self._steps.setdefault(model, deque(maxlen=WINDOW)).append((sequences, prompt_tokens, seconds))
            self._observed[model] = self._observed.get(model, 0) + 1
        if sequences and tokens is not None:  # (the loop's steps: a probe's never propose)
            self._tokens.setdefault(model, deque(maxlen=TOKENS_WINDOW)).append((sequences, tokens))

    def knows(self, model: str) -> bool:
        return bool(self._steps.get(model))

    def speed(self, model: str) -> Speed | None:
        """`model`'s fitted pace, fitted again every REFIT steps (the loop asks before each step)."""
        steps = self._steps.get(model)
        if not steps:
            return None
        count, known = self._fitted.get(model, (-REFIT, None))
        seen = self._observed.get(model, 0)
        if known is None or seen - count >= REFIT:
            known = self._fit(model, list(steps))
            self._fitted[model] = (seen, known)
        return known

    def speeds(self) -> dict[str, Speed]:
        """Each measured model's fitted pace (the window is copied first: the loop appends meanwhile)."""
        return {model: self._fit(model, list(steps)) for model, steps in list(self._steps.items()) if steps}

    def _fit(self, model: str, steps: list[Step]) -> Speed:
        """`fit`, with the tokens a sequence got a step over the window (1: none kept proposals)."""
        counts = list(self._tokens.get(model, ()))
        sequences = sum(n for n, _ in counts)
        per_step = sum(t for _, t in counts) / sequences if sequences else 1.0
        return dataclasses.replace(fit(steps), tokens_per_step=max(1.0, per_step))


def fit(steps: list[Step]) -> Speed:
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


def probe(
    model: nn.Module, max_batch: int, prefill_step: int, max_kv_size: int | None = None, batching: Batching = "padded"
) -> list[Step]:
    """Steps of a model just loaded, timed on a batch of its own: decode steps of one sequence, a prompt read beside
    it, decode steps of `max_batch` sequences (as many as PROBE_FILL_S let join, on a slow device). The first passes
    are not timed (they allocate), nor are the steps that fill the batch (its sequences join 8 a step)."""
    began = time.perf_counter()
    batch = ContinuousBatch(model, prefill_step, min(max_batch, PREFILL_BATCH), max_kv_size, batching)
    prompt = list(range(1, PROBE_PROMPT + 1))
    try:
        batch.insert(prompt, LONG, greedy_sampler)
        _until(batch, 1)  # its prompt read, its first token drawn
        steps = _timed(batch, PROBE_STEPS, PROBE_LEAST_S)
        second = batch.insert(prompt, LONG, greedy_sampler)
        steps += _timed(batch, 1)  # its prompt, read beside the first's decode
        if max_batch == 1:
            batch.remove([second])
            return steps
        size = 2
        while size < max_batch and time.perf_counter() - began < PROBE_FILL_S:
            for _ in range(min(PREFILL_BATCH, max_batch - size)):
                batch.insert(prompt[:1], LONG, greedy_sampler)  # (a one-token prompt joins the decode rows at once)
                size += 1
            batch.step()
        _until(batch, size)
        return steps + _timed(batch, PROBE_STEPS, PROBE_LEAST_S)
    finally:
        batch.close()


def _until(batch: ContinuousBatch, sequences: int) -> None:
    """Step until `sequences` generate a token each step (a bounded number of steps: prompts join 8 at a time)."""
    for _ in range(8 + sequences):
        if len(batch.step()) >= sequences:
            return


def _timed(batch: ContinuousBatch, count: int, least_s: float = 0.0) -> list[Step]:
    """`count` steps, each timed, or more until `least_s` has gone on them (tiny steps are noisy), or fewer (2 at
    least) once PROBE_S has; each counted at their median time (one step a busy machine stalled is not the pace)."""
    steps: list[Step] = []
    began = time.perf_counter()
    while len(steps) < PROBE_MOST:
        started = time.perf_counter()
        n = len(batch.step())
        steps.append((n, batch.padded_prefill, time.perf_counter() - started))
        spent = time.perf_counter() - began
        if (len(steps) >= count and spent >= least_s) or (len(steps) >= 2 and spent > PROBE_S):
            break
    typical = float(np.median([seconds for _, _, seconds in steps]))
    return [(n, prefill, typical) for n, prefill, _ in steps]
