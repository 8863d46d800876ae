"""How many prompt tokens a model should read in one step: ONELANE_PREFILL_STEP, unless reading more tokens at once
costs it more per token, as for mlx-lm's Jamba, whose Mamba layers read a chunk token by token into a state array
they copy whole for each token (mlx-lm's `ssm_step`: a chunk of n tokens costs about n² here: with `mamba_expand`
128, 1 token 0.1 s, 8 tokens 5.6 s, 32 tokens 50 s on 2 CPU cores, so that one 64-token prompt read whole held the
device for minutes). Found as the model loads, before its steps are timed (worker/pace.py): chunks of 1, 2, 4, ...
tokens are read on a cache of their own, each timed, until a chunk costs more per token than the cheapest so far by
RISE, twice (the model reads prompts in chunks of that cheapest size), or takes LONGEST_S, or reaches the prefill
step (it reads prompts in chunks of the prefill step). A chunk past the first that took LONGEST_S while it costs more
per token than the cheapest by SETTLE, twice, does not end the search: on a busy machine a 1-token read's fixed cost
grows and hides part of a rise (a Mamba 16 wide: 2 tokens cost 1.5-3 times what 1 does there, and the search had
stopped at 2 or 4 tokens and chosen the whole prefill step in 3 of 12 loads). The search goes on while the cost per
token keeps rising that way, and a chunk that took CEILING_S so ends it with the cheapest chunk. Nor does the first
read end it (beside a busy machine mlx-lm's test Jamba read 1 token in 0.2 s, and the search had stopped there).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

RISE = 2.0  # a chunk costing this many times the cheapest per token: reading more at once costs more
LONGEST_S = 0.2  # a chunk that took this long ends the search (its size is as far as the timings need to go)
SETTLE = 1.25  # a chunk past LONGEST_S costing this many times the cheapest per token: the search goes on
CEILING_S = 1.0  # ... until a chunk takes this long (the cheapest is chosen) or rises by RISE
NOISE_S = 0.05  # chunks quicker than this are not judged (a busy machine's noise)
RETIMES = 4  # a rise is timed again this many times, both chunks in turns, the quickest kept: a busy machine's
#              stalls are not the model's cost


@dataclass(frozen=True)
class Chunking:
    """The chunk found, and what was timed (tokens, seconds), for the log."""

    chunk: int
    timed: tuple[tuple[int, float], ...]

    @property
    def why(self) -> str:
        return ", ".join(f"{n} token{'s' * (n > 1)}: {s:.2f} s" for n, s in self.timed)


def choose_chunk(model: nn.Module, prefill_step: int, vocab: int) -> Chunking:
    """The chunk `model` reads prompts in (see the module's docstring)."""
    _read(model, 1, vocab)  # (the first pass allocates: not timed)
    timed: dict[int, float] = {}
    n, best = 1, 1
    while n <= prefill_step:
        timed[n] = _read(model, n, vocab)
        long = n > 1 and timed[n] >= LONGEST_S
        if _rises(timed, n, best, SETTLE if long else RISE):  # timed again, both, in turns: a busy machine's
            for k in (n, best) * RETIMES:  # stalls are not the model's cost
                timed[k] = min(timed[k], _read(model, k, vocab))
        rising = _rises(timed, n, best, SETTLE)
        if _rises(timed, n, best, RISE) or (rising and timed[n] >= CEILING_S):
            return Chunking(best, tuple(timed.items()))
        if long and not rising:
            break
        if timed[n] / n <= timed[best] / best:
            best = n
        n *= 2
    return Chunking(prefill_step, tuple(timed.items()))


def _rises(timed: dict[int, float], n: int, best: int, bar: float) -> bool:
    """Reading n tokens at once costs more per token, by `bar`, than the cheapest chunk so far."""
    return timed[n] >= NOISE_S and timed[n] / n > bar * timed[best] / best


def _read(model: nn.Module, n: int, vocab: int) -> float:
    """Seconds to read an n-token prompt on a fresh cache."""
    cache = make_prompt_cache(model)
    tokens = mx.array([[1 + (k * 7) % max(vocab - 1, 1) for k in range(n)]])
    started = time.perf_counter()
    model(tokens, cache=cache)
    mx.eval([c.state for c in cache])
    return time.perf_counter() - started
