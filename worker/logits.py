"""How one sequence draws its next token beyond its sampler: OpenAI's penalties and logit_bias (over the tokens it
generated, not its prompt's, as tasks/job.py's SamplingParams defines them), and the log probabilities it records.

All of it is part of the step's own computation: mlx-lm hands each sequence's sampler the distribution of its next
token (after the logits processors: a grammar's mask), and `Draw` wraps the sampler, so nothing here makes the
worker wait for the device between steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import mlx.core as mx

from tasks.job import SamplingParams

Sampler = Callable[[mx.array], mx.array]
Recorded = tuple[mx.array, mx.array | None, mx.array | None]  # the token's log probability, the top ids, theirs


class Draw:
    """A sequence's sampler, wrapped: the penalties and biases change the distribution it draws from (renormalized:
    what it records is what it drew from, before temperature), then it draws. `generated`: the tokens its job
    generated before (in an earlier run, or forced by its grammar), which the penalties count too. With `record`
    (where this step's new arrays go, for the engine to start computing them at once), each draw's log
    probability and the `top` likeliest tokens are kept, in order, for the engine to read once the token is out."""

    def __init__(
        self,
        params: SamplingParams,
        sampler: Sampler,
        generated: tuple[int, ...],
        vocab: int,
        record: list[mx.array] | None = None,
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
        self.recorded: deque[Recorded] = deque()

    def __call__(self, logprobs: mx.array) -> mx.array:
        if self.bias is not None or self.counts is not None:
            if self.bias is not None:
                logprobs = logprobs.at[:, self.bias[0]].add(self.bias[1].astype(logprobs.dtype))
            if self.counts is not None:
                penalty = self.frequency * self.counts + self.presence * (self.counts > 0)
                logprobs = logprobs - penalty.astype(logprobs.dtype)
            logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
        token = self.sampler(logprobs)
        if self.counts is not None:
            self.counts = self.counts.at[token].add(1.0)
        if self.record is not None:
            self._keep(logprobs, token)
        return token

    def _keep(self, logprobs: mx.array, token: mx.array) -> None:
        chosen = mx.take_along_axis(logprobs, token.reshape(-1, 1), axis=-1)
        ids = values = None
        if self.top:
            ids = mx.argpartition(-logprobs, kth=min(self.top, logprobs.shape[-1]) - 1, axis=-1)[:, : self.top]
            values = mx.take_along_axis(logprobs, ids, axis=-1)
        self.recorded.append((chosen, ids, values))
        self.record.extend(a for a in (chosen, ids, values) if a is not None)  # type: ignore[union-attr]
