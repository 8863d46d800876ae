"""The log probabilities of what the batch draws, for the sequences that ask for them (`Logprobs`, an engine's):
each one's sampler (worker/batch/logits.py's Draw) keeps what it drew, a step's draws are recorded together right after
its forward pass, and each token's entry (tasks/logprobs.py) is made from them a step later, as the token is read."""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx

from tasks.logprobs import TokenLogprob
from worker.batch.logits import Draw, Recorded
from worker.token_bytes import TokenBytes


class Logprobs:
    """An engine's record of log probabilities: the samplers of its sequences that record them, what they drew in
    this step, and the tokens' entries made from them. The engine's thread alone uses it."""

    def __init__(self, token_bytes: TokenBytes, eos: frozenset[int]) -> None:
        self.token_bytes, self.eos = token_bytes, eos
        self.draws: dict[int, Draw] = {}  # the samplers of the sequences that record log probabilities
        self.fresh: list[tuple[Draw, mx.array, mx.array]] = []  # what they drew in this step, to be recorded

    def follow(self, uid: int, draw: Draw) -> None:
        """A sequence whose sampler records the log probabilities of what it draws: its tokens get entries."""
        self.draws[uid] = draw

    def forget(self, uid: int) -> None:
        """A sequence left the batch: nothing more of its draws is read."""
        self.draws.pop(uid, None)

    def clear(self) -> None:
        """Forget every sequence (the batch starts afresh)."""
        self.draws.clear()
        self.fresh.clear()

    def record(self) -> None:
        """The log probabilities of what the step's draws drew, computed together right after its forward pass
        (not when first read: that would wait for the next step's), for the tokens' entries a step later."""
        if not self.fresh:
            return
        draws, rows, tokens = zip(*self.fresh)
        self.fresh.clear()
        recorded = Recorded.of(mx.concatenate(list(rows)), mx.concatenate(list(tokens)), max(d.top for d in draws))
        recorded.start()
        for i, draw in enumerate(draws):
            draw.recorded.append((recorded, i))

    def step_entries(self, generated: list[Any]) -> dict[int, str]:
        """The log probabilities' entries of the step's tokens whose sequences record them, as their samplers
        recorded them when they drew these tokens (a step before: computed by now). The end of a sequence (EOS) is
        no text: its entry is `null`."""
        entries = {}
        for r in generated:
            draw = self.draws.get(int(r.uid))
            if draw is None:
                continue
            recorded, i = draw.recorded.popleft()
            token = int(r.token)
            if r.finish_reason == "stop" and token in self.eos:
                entries[int(r.uid)] = "null"
                continue
            entries[int(r.uid)] = self.entry(token, *recorded.row(i), draw.top)
        return entries

    def entry(self, token: int, logprob: float, top: list[tuple[int, float]], most: int) -> str:
        """A token's entry, with its `most` likeliest alternatives (a token ruled out, at -inf, is none of them)."""
        ranked = sorted(((v, i) for i, v in top if v != -math.inf), reverse=True)[:most]
        return TokenLogprob(
            self.token_bytes[token], logprob, tuple((self.token_bytes[i], v) for v, i in ranked)
        ).encode()

    def entries(self, rows: mx.array, tokens: list[int], top: int) -> list[str]:
        """For each row of log probabilities (a prompt's, read outside the batch), its token's entry."""
        recorded = Recorded.of(rows, mx.array(tokens), top)
        return [self.entry(t, *recorded.row(i), top) for i, t in enumerate(tokens)]
