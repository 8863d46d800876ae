"""How many prompt tokens a model reads a step is found as it loads (worker/batch/chunking.py), here on models whose
read of n tokens costs a set time (spent asleep, so that a busy machine does not change it): a cost per token that
rises only mildly at first, as a busy machine's fixed cost makes a Mamba's look, is followed past LONGEST_S; a cost
that falls ends the search there, though the very first read alone never does."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from worker.batch.chunking import LONGEST_S, choose_chunk

STEP = 128


class Costly(nn.Module):
    """A model whose read of n tokens takes cost(n) seconds, and that has no cache."""

    def __init__(self, cost: Callable[[int], float]) -> None:
        super().__init__()
        self._cost = cost

    def make_cache(self) -> list[Any]:
        return []

    def __call__(self, tokens: mx.array, cache: Any = None) -> mx.array:
        time.sleep(self._cost(tokens.shape[1]))
        return tokens


def test_a_cost_per_token_that_rises_mildly_past_the_longest_read_is_followed_until_it_clearly_rises() -> None:
    # Given a model whose cost per token, cheapest at 2 tokens, rises 1.4 times by 4 tokens (a read of 0.22 s, past
    # LONGEST_S) and 2.6 times by 8
    found = choose_chunk(Costly(lambda n: 0.03 + 0.012 * n * n), STEP, 2048)
    # Then it reads 2 tokens a step, found at 8 (before, the search ended at 4 and chose the whole prefill step)
    assert found.chunk == 2, found.why
    assert [n for n, _ in found.timed] == [1, 2, 4, 8]


def test_a_cost_per_token_that_falls_ends_the_search_at_the_longest_read_but_not_at_the_first() -> None:
    # Given a model whose every read takes over LONGEST_S, the most of it fixed (a big model on a busy machine)
    found = choose_chunk(Costly(lambda n: LONGEST_S + 0.05 + 0.001 * n), STEP, 2048)
    # Then it reads the whole prefill step, after timing 2 tokens as well as 1 (one read alone says nothing of a rise)
    assert found.chunk == STEP, found.why
    assert [n for n, _ in found.timed] == [1, 2]
