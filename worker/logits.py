"""What changes a sequence's logits before it samples, besides its grammar (worker/grammar.py): OpenAI's penalties
and logit_bias, over the tokens it generated (not its prompt's), as tasks/job.py's SamplingParams defines them."""

from __future__ import annotations

import mlx.core as mx

from tasks.job import SamplingParams


class Penalties:
    """A logits processor of one sequence. mlx-lm hands it the sequence's tokens so far (its prompt, then what it
    generated): it counts those past the prompt's `start`, as they come, so a run that goes on from an earlier
    run's tokens (read as prompt) counts them too."""

    def __init__(self, params: SamplingParams, start: int, vocab: int) -> None:
        self.start = start
        self.presence, self.frequency = params.presence_penalty, params.frequency_penalty
        self.counts = mx.zeros((vocab,), dtype=mx.float32) if self.presence or self.frequency else None
        self.seen = 0
        bias = sorted(params.logit_bias.items())
        self.bias_ids = mx.array([t for t, _ in bias], dtype=mx.int32) if bias else None
        self.bias = mx.array([v for _, v in bias], dtype=mx.float32) if bias else None

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self.bias_ids is not None:
            logits = logits.at[:, self.bias_ids].add(self.bias.astype(logits.dtype))  # type: ignore[union-attr]
        if self.counts is None:
            return logits
        upto = tokens.shape[0] - self.start
        if upto > self.seen:  # (the tokens generated since the last call: one, or a run's earlier ones at first)
            self.counts = self.counts.at[tokens[self.start + self.seen :]].add(1.0)
            self.seen = upto
        penalty = self.frequency * self.counts + self.presence * (self.counts > 0)
        return logits - penalty.astype(logits.dtype)
