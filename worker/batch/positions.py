"""Each sequence's own positions, for a model whose positions depend on its images (M-RoPE: Qwen2-VL, Qwen2.5-VL,
Qwen3-VL and its MoE, Qwen 3.5, GLM-4V).

Such a language model rotates each token by three positions (time, height, width): a text token's are its index
three times; an image's tokens take theirs from the image's grid, so that every token after an image is shifted by
the prompt's `rope_delta` (the last position + 1 - the prompt's length: negative, an image of h x w tokens spans
max(h, w) positions, not h * w). mlx-vlm's language models keep ONE `_position_ids` / `_rope_deltas` on the module
(the last prompt's, set by `get_input_embeddings` or their first forward pass), so in a batch every row would be
rotated by another's image. They do take explicit `position_ids` of shape (3, B, L) and use them as they are; so
the batch passes every row's, at every forward pass, text rows too (their index, delta 0): `Positions.span` gives a
sequence's for the tokens it reads next, from its own bookkeeping (the tokens it holds), never from a cache's
offset. A sequence's positions depend only on its prompt's ids and its images' grids (the model's own
`get_rope_index`), computed when it enters the batch (worker/vision.py: `VisionEngine.positions`), whichever way it
comes (a prompt, a prefix-cache hit that reads no pixels, a resumed job, a choice of `n`, a preempted row put back).

Upstream: mlx-vlm's own batch generator works around that state with a delta per row beside its caches
(generate/ar.py); the fix that would let any batch drive these models is a language model whose call takes each
row's positions (or deltas) and keeps no prompt's state on the module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np


@dataclass(frozen=True)
class Positions:
    """A sequence's positions: its prompt's first tokens' as its images place them (`head`, 3 x n: up to its last
    image), then each token's index + `delta`."""

    head: np.ndarray | None  # (3, n) int32, or None: a text sequence's
    delta: int = 0

    def span(self, start: int, length: int) -> np.ndarray:
        """The (3, length) positions of its tokens start .. start + length."""
        text = np.broadcast_to(np.arange(start, start + length, dtype=np.int32) + self.delta, (3, length))
        if self.head is None or start >= self.head.shape[1]:
            return text
        known = self.head[:, start : start + length]
        return np.concatenate([known, text[:, known.shape[1] :]], axis=1)


TEXT = Positions(None, 0)


def batched(rows: Sequence[Positions | None], starts: Sequence[int], length: int) -> mx.array:
    """The (3, B, length) positions of B sequences reading `length` tokens each from their `starts`."""
    return mx.array(np.stack([(p or TEXT).span(s, length) for p, s in zip(rows, starts)], axis=1))


def from_offset(offset: int | mx.array, batch: int, length: int) -> mx.array:
    """Text positions from a cache's offset (a forward pass outside the batch, on a fresh cache: the probes)."""
    if isinstance(offset, mx.array) and offset.ndim > 0:
        starts = [int(o) for o in np.asarray(offset).reshape(-1)]
    else:
        starts = [int(offset)] * batch
    return batched([None] * batch, starts, length)
