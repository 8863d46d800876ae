"""How one sequence draws its next token beyond its sampler: OpenAI's penalties and logit_bias (over the tokens it
generated, not its prompt's, as tasks/job.py's SamplingParams defines them), and the log probabilities it records.

All of it is part of the step's own computation: mlx-lm hands each sequence's sampler the distribution of its next
token (after the logits processors: a grammar's mask), `Draw` wraps the sampler, and the engine computes what the
step's draws recorded in one batch (`Recorded`), started with the step: nothing here makes the worker wait for the
device between steps.
"""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx

from tasks.job import SamplingParams
from worker.batch.sampling import Sampler

BLOCK = 256  # top_k reads the row in blocks of this many tokens
_vocabularies: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # by tokenizer


def vocabulary(tokenizer: Any, width: int) -> int:
    """How many token ids a request may name (`logit_bias`): one past the tokenizer's highest id, within the
    model's `width` logit rows. The rows past the tokenizer's ids are padding (Qwen's models have 151,936 for
    151,669 tokens): no token, written as nothing or as another's text."""
    if tokenizer not in _vocabularies:  # (once per tokenizer: its vocabulary is read whole)
        _vocabularies[tokenizer] = max(tokenizer.get_vocab().values(), default=-1) + 1
    return min(_vocabularies[tokenizer], width)


class Draw:
    """A sequence's sampler, wrapped: the penalties and biases change the distribution it draws from, then it draws.
    `generated`: the tokens its job generated before (in an earlier run, or forced by its grammar), which the
    penalties count too. With `record` (where this step's draws go, for the engine to compute their log
    probabilities together), each draw's distribution (renormalized after penalties and biases: what it drew from,
    before temperature) and token are kept; `recorded` holds, in order, where each draw's figures are."""

    def __init__(
        self,
        params: SamplingParams,
        sampler: Sampler,
        generated: tuple[int, ...],
        vocab: int,
        record: list[tuple[Draw, mx.array, mx.array]] | None = None,
    ) -> None:
        self.sampler = sampler
        self.presence, self.frequency = params.presence_penalty, params.frequency_penalty
        self.counts: mx.array | None = None
        if self.presence or self.frequency:
            self.counts = mx.zeros((vocab,), dtype=mx.float32)
            if generated:
                self.counts = self.counts.at[mx.array(generated)].add(1.0)
        bias = sorted(params.logit_bias.items())
        self.bias = (mx.array([t for t, _ in bias]), mx.array([v for _, v in bias], dtype=mx.float32)) if bias else None
        self.top = params.top_logprobs
        self.record = record
        self.recorded: deque[tuple[Recorded, int]] = deque()

    def __call__(self, logprobs: mx.array) -> mx.array:
        changed = self.bias is not None or self.counts is not None
        if self.bias is not None:
            logprobs = logprobs.at[:, self.bias[0]].add(self.bias[1].astype(logprobs.dtype))
        if self.counts is not None:
            penalty = self.frequency * self.counts + self.presence * (self.counts > 0)
            logprobs = logprobs - penalty.astype(logprobs.dtype)
        if changed and self.record is not None:  # (a sampler needs no normalized input; what is recorded does)
            logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
        token = self.sampler(logprobs)
        if self.counts is not None:
            self.counts = self.counts.at[token].add(1.0)
        if self.record is not None:
            self.record.append((self, logprobs, token))
        return token


@dataclass
class Recorded:
    """Log probabilities of one token per row, with the `top` likeliest at its place, computed together (lazily:
    `start` them, read them once computed)."""

    chosen: mx.array
    ids: mx.array | None
    values: mx.array | None
    _lists: tuple[list[Any], list[Any], list[Any]] | None = None

    @classmethod
    def of(cls, rows: mx.array, tokens: mx.array, top: int) -> Recorded:
        chosen = mx.take_along_axis(rows, tokens.reshape(-1, 1), axis=-1)[:, 0]
        if not top:
            return cls(chosen, None, None)
        ids = top_k(rows, min(top, rows.shape[-1]))
        return cls(chosen, ids, mx.take_along_axis(rows, ids, axis=-1))

    def start(self) -> None:
        mx.async_eval([a for a in (self.chosen, self.ids, self.values) if a is not None])

    def row(self, i: int) -> tuple[float, list[tuple[int, float]]]:
        """Row i's token's log probability, and its alternatives (ids and log probabilities, in no order)."""
        if self._lists is None:
            top_ids = self.ids.tolist() if self.ids is not None else None
            top_values = self.values.tolist() if self.values is not None else None
            lists = (self.chosen.tolist(), top_ids or [], top_values or [])
            self._lists = cast(tuple[list[Any], list[Any], list[Any]], lists)  # (tolist of arrays: lists, not scalars)
        chosen, ids, values = self._lists
        return chosen[i], list(zip(ids[i], values[i])) if ids else []


def top_k(rows: mx.array, k: int) -> mx.array:
    """The ids of the k largest values of each row (in no order), exactly, and some six times faster than a
    partition of the whole row on a CPU: each of them lies in one of the k blocks with the largest maxima, so only
    those blocks are partitioned."""
    n, width = rows.shape
    blocks = -(-width // BLOCK)
    if blocks <= k:
        return mx.argpartition(-rows, kth=k - 1, axis=-1)[:, :k]
    if blocks * BLOCK != width:
        rows = mx.pad(rows, [(0, 0), (0, blocks * BLOCK - width)], constant_values=-float("inf"))
    grid = rows.reshape(n, blocks, BLOCK)
    best = mx.argpartition(-grid.max(axis=-1), kth=k - 1, axis=-1)[:, :k]  # (n, k) blocks
    candidates = mx.take_along_axis(grid, best[:, :, None], axis=1).reshape(n, k * BLOCK)
    within = mx.argpartition(-candidates, kth=k - 1, axis=-1)[:, :k]
    return mx.take_along_axis(best, within // BLOCK, axis=-1) * BLOCK + within % BLOCK
