"""How the continuous batch (worker/batch/forward.py) reads the prompts of the sequences that join it, and where
each of its sequences is meanwhile: waiting, reading its prompt, or decoding (`Prefilling`, the part of the batch
that `ContinuousBatch` stands on).

A step's prefill: the sequences reading their prompts (at most `prefill_batch` at once, in order of arrival) read
their next chunk of at most `prefill_step` tokens each, side by side (padded to the longest chunk); those with only
their last token left join the decode rows. While rows decode, with a `decode_floor` (tokens per second), the
chunks of long prompts are sized so that a step takes at most 1 / decode_floor (a step whose every decode row
checks proposals: as many times that as the tokens the row expected to gain least gets, worker/batch/forward.py
`_fit_chunk`): after each such step they grow or shrink by the ratio of that bound to the step's time (at most
doubling, never past the prefill step; 16 tokens at least, so that a prompt always progresses, or the prefill step
where that is less), so long prompts read beside the streams slow them to the floor at worst, however many arrive.
A prompt of one chunk (`prefill_step` tokens or fewer: a question) reads whole in one step: a crowd of questions
arriving may slow the streams for the steps that read them,
not longer. A prompt with images reads beside them, one at a time, in chunks of its input embeddings (its images
as the vision model sees them, computed as its first chunk is read): the others go on decoding while it reads, and
it joins the decode rows as any other.

How a model's sequences share the batch (`Batching`, decided as the model loads: worker/batch/sharing.py):
- `padded`: as above; prompts read side by side are padded to the longest chunk (the caches mask the padding);
- `unpadded`: prompts read side by side read as many tokens each, the shortest chunk's, so that no padding goes
  through a layer whose state it would change (a Mamba or linear-attention state, a convolution's window: mlx-lm's
  batched caches mask padding only for the models that ask them); decode rows are never padded;
- `alone`: one sequence at a time, on its own caches as mlx-lm's generate_step keeps them (a cache mlx-lm cannot
  merge, such as Llama 4's chunked one, or a model whose batched forward pass is wrong or fails); the others wait
  in order, inserted.
"""

from __future__ import annotations

import copy as _copy
from collections import deque
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache
from mlx_lm.utils import maybe_set_recommended_wired_limit

from worker.batch.positions import batched
from worker.batch.rows import Batching, Beside, Counters, Row


class Prefilling:
    """A continuous batch's sequences, each where it is, and the reading of their prompts (the prefill of a step);
    worker/batch/forward.py's `ContinuousBatch` makes them join, step and leave."""

    def __init__(
        self,
        model: nn.Module,
        prefill_step: int,
        prefill_batch: int,
        max_kv_size: int | None,
        batching: Batching = "padded",
        decode_floor: float = 0.0,
    ) -> None:
        self.model, self.prefill_step, self.max_kv_size = model, prefill_step, max_kv_size
        # its positions depend on its images (worker/batch/positions.py): every forward pass passes each row's
        self.positional = bool(getattr(model, "positional", False))
        self.batching = batching
        self.decode_floor = decode_floor  # tokens/s the decode rows keep while prompts are read (0: no floor)
        self.chunk = prefill_step  # a reader's chunk while rows decode (fitted to the floor after each such step)
        self.prefill_batch = 1 if batching == "alone" else prefill_batch
        # an image prompt reads in one pass (a prefix-LM: PaliGemma, its last token too; HunYuan VL: its positions)
        self.whole_prompts = False
        self.work = Counters()
        self.padded_prefill = 0  # the last step's prompt tokens, padded to its longest chunk
        self._uids = 0
        self._waiting: deque[Row] = deque()  # inserted, not reading yet
        self._seeing: deque[Row] = deque()  # prompts with images, inserted; the first reads (on its own cache)
        self._reading: list[Row] = []  # reading their prompts, side by side
        self._reading_cache: list[Any] = []  # their batched KV cache (one per layer), [] while none reads
        self._rows: list[Row] = []  # decode rows, in the order of `_cache`'s batch and of `_next`
        self._cache: list[Any] = []
        self._next: mx.array | None = None  # the tokens each decode row reads next (its last draw, still computing)
        self._wired = maybe_set_recommended_wired_limit()  # on Metal: the model's memory kept wired while it runs

    def _prefill(self, cap: int) -> int:
        """Read a chunk of at most `cap` tokens of each reading prompt; those with only their last token left become
        decode rows. Returns the tokens read (padding included)."""
        self._admit_readers()
        self._to_decode([i for i, r in enumerate(self._reading) if len(r.unread) == 1])
        if not self._reading:
            self.padded_prefill = 0
            return 0
        # a prompt within one chunk of the prefill step reads whole (a question is never cut for the floor's sake);
        # beside such, a long prompt reads as many tokens as their padding costs anyway
        whole = [len(r.unread) - 1 for r in self._reading if len(r.unread) - 1 <= self.prefill_step]
        cap = max([cap, *whole]) if self.batching == "padded" else cap
        chunks = [
            r.unread[: len(r.unread) - 1 if len(r.unread) - 1 <= self.prefill_step else cap] for r in self._reading
        ]
        if self.batching == "unpadded":
            shortest = min(len(c) for c in chunks)
            chunks = [c[:shortest] for c in chunks]
        lengths = [len(c) for c in chunks]
        longest = max(lengths)
        padding = [longest - n for n in lengths]
        if max(padding) > 0:
            for c in self._reading_cache:
                c.prepare(lengths=lengths, right_padding=padding)
            tokens = mx.array([c + [0] * p for c, p in zip(chunks, padding)])
        else:
            tokens = mx.array(chunks)
        self._forward(tokens, self._reading_cache, self._reading)  # only the caches are evaluated: no logits
        mx.eval([c.state for c in self._reading_cache])
        if max(padding) > 0:
            for c in self._reading_cache:
                c.finalize()
            mx.eval([c.state for c in self._reading_cache])
        mx.clear_cache()
        for row, chunk in zip(self._reading, chunks):
            row.tokens += chunk
            del row.unread[: len(chunk)]
        self.work.prompt_tokens += sum(lengths)
        self.padded_prefill = len(chunks) * longest
        self._to_decode([i for i, r in enumerate(self._reading) if len(r.unread) == 1])
        return self.padded_prefill

    def _see(self, cap: int) -> int:
        """The first prompt with images reads its next chunk (at most `cap` tokens), on its own cache, from its input
        embeddings; with only its last token left, it joins the decode rows. (Alone: once nothing else runs.)
        Returns the tokens read."""
        if not self._seeing:
            return 0
        row = self._seeing[0]
        if (self.batching == "alone" or row.alone or self._alone_decoding()) and (self._reading or self._rows):
            return 0
        if callable(row.embeds):  # its first chunk: its images are read now (the vision tower's pass), a part a step
            embeds = row.embeds()
            if embeds is None:
                return 0
            row.embeds, second = embeds if isinstance(embeds, tuple) else (embeds, None)
            row.beside = second if isinstance(second, Beside) else None
            row.extras = second if second is not None and not isinstance(second, Beside) else None
        assert row.embeds is not None and row.ids is not None and row.cache is not None
        beside = row.beside.prompt if row.beside is not None else {}
        n = len(row.unread) - 1 if self.whole_prompts else min(cap, len(row.unread) - 1)
        if n > 0:
            read = n + 1 if self.whole_prompts and row.embeds.shape[0] > n else n  # (a prefix-LM's: its last too)
            extras = row.extras.take(row.seen, read) if row.extras is not None else {}
            self._forward(
                mx.array([row.ids[:read]]), row.cache, [row], inputs_embeds=row.embeds[None, :read], **beside, **extras
            )
            row.seen += n
            if read > n:  # (its last token's KV goes: its decode row reads it again, seeing the same prefix)
                trim_prompt_cache(row.cache, 1)
            mx.eval([c.state for c in row.cache])
            mx.clear_cache()
            row.tokens += row.unread[:n]
            del row.unread[:n], row.ids[:n]
            row.embeds = row.embeds[n:]
            self.work.prompt_tokens += n
        if len(row.unread) == 1:
            self._seeing.popleft()
            row.embeds = row.ids = row.extras = None
            cache, row.cache = row.cache, None
            self._join_decode([row], self._merge([cache]))
        return max(n, 0)

    def _forward(
        self, tokens: mx.array, cache: list[Any], rows: list[Row], inputs_embeds: mx.array | None = None, **extras: Any
    ) -> mx.array:
        """The model's forward pass over `tokens` (a row each, from the tokens each holds), its logits; a model whose
        positions depend on its images is given each row's own (worker/batch/positions.py)."""
        if inputs_embeds is not None:
            extras["inputs_embeds"] = inputs_embeds
        if self.positional:
            extras["positions"] = batched([r.positions for r in rows], [len(r.tokens) for r in rows], tokens.shape[1])
        logits: mx.array = self.model(tokens, cache=cache, **extras)
        return logits

    def _alone_decoding(self) -> bool:
        """Whether a sequence that runs alone (`Row.alone`) decodes now."""
        return any(r.alone for r in self._rows)

    def _beside(self) -> dict[str, mx.array]:
        """What the decode step's forward pass takes beside its tokens: a sequence alone's inputs (its prompt's at its
        first step, as its last prompt token is read then)."""
        inputs = self._rows[0].beside if len(self._rows) == 1 else None
        if inputs is None:
            return {}
        return inputs.prompt if self._rows[0].generated == 0 else inputs.step

    def _own_cache(self, i: int) -> list[Any]:
        """A reader's KV cache, out of the batched one (a fresh one if it holds nothing yet: a one-token prompt)."""
        if not self._reading[i].tokens:
            return make_prompt_cache(self.model, self.max_kv_size)
        return self._take(self._reading_cache, i, copy=len(self._reading) > 1)

    def _admit_readers(self) -> None:
        """Waiting sequences start reading, in order, while fewer than `prefill_batch` read."""
        n = min(self.prefill_batch - len(self._reading), len(self._waiting))
        if n <= 0 or (self.batching == "alone" and (self._reading or self._rows or self._seeing)):
            return
        if self._alone_decoding():
            return
        if self._seeing and self._seeing[0].alone:  # it waits for the batch to drain: only those before it join
            n = sum(1 for r in list(self._waiting)[:n] if r.uid < self._seeing[0].uid)
            if n <= 0:
                return
        joining = [self._waiting.popleft() for _ in range(n)]
        merged = self._merge([r.cache or [] for r in joining])
        for r in joining:
            r.cache = None
        if self._reading_cache:
            for mine, theirs in zip(self._reading_cache, merged):
                mine.extend(theirs)
        else:
            self._reading_cache = merged
        self._reading += joining

    def _to_decode(self, indices: list[int]) -> None:
        """These readers become decode rows: their caches join the decode batch, their last token its next read."""
        if not indices:
            return
        moving = [self._reading[i] for i in indices]
        merged = self._merge([self._own_cache(i) for i in indices])
        self._reading, self._reading_cache = self._filtered(self._reading, self._reading_cache, {r.uid for r in moving})
        self._join_decode(moving, merged)

    def _join_decode(self, moving: list[Row], merged: list[Any]) -> None:
        """Rows whose prompt is read but its last token join the decode rows, with their (merged) KV caches."""
        last = mx.array([r.unread.pop() for r in moving])
        if self._cache:
            for mine, theirs in zip(self._cache, merged):
                mine.extend(theirs)
            assert self._next is not None
            self._next = mx.concatenate([self._next, last.astype(self._next.dtype)])
        else:
            self._cache, self._next = merged, last
        mx.async_eval(self._next)  # (as in ContinuousBatch._keep_rows)
        self._rows += moving

    def _merge(self, caches: list[list[Any]]) -> list[Any]:
        """Per-sequence KV caches (each a list, one per layer) as one batched cache per layer; alone, the one
        sequence's own."""
        if self.batching == "alone":
            assert len(caches) == 1, "a batch of sequences alone merges no caches"
            return caches[0]
        return [caches[0][layer].merge([c[layer] for c in caches]) for layer in range(len(caches[0]))]

    def _take(self, cache: list[Any], i: int, copy: bool) -> list[Any]:
        """Sequence `i`'s KV cache out of a batched one (always a copy); alone, its own: a copy if it stays."""
        if self.batching != "alone":
            return [c.extract(i) for c in cache]
        return _copy.deepcopy(cache) if copy else cache

    @staticmethod
    def _filtered(rows: list[Row], cache: list[Any], gone: set[int]) -> tuple[list[Row], list[Any]]:
        stay = [i for i, r in enumerate(rows) if r.uid not in gone]
        if len(stay) == len(rows):
            return rows, cache
        if not stay:
            return [], []
        for c in cache:
            c.filter(stay)
        return [rows[i] for i in stay], cache
