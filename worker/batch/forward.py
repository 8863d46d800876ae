"""The continuous batch: sequences join and leave at any step; each step advances every generating sequence by one
token in one forward pass, and reads a chunk of the joining prompts beside it.

It is built on mlx-lm's public parts (the model, its KV caches and their batched forms: merge, extend, filter,
extract), like mlx-lm's BatchGenerator, with one difference that matters under load: a joining prompt's last token
is read in the next decode step, as one more row of it, not in a forward pass of its own. BatchGenerator reads it
alone first (one more forward over the model's weights per join, ~65 ms on SmolLM2-135M on 2 CPU cores, where a
decode step at 8 sequences takes ~100 ms); here it costs a row (bench/join_cost.py measures both).

A step, in order:
1. read: the tokens the decode rows drew in the step before (computed by now: the loop handled the step's output
   meanwhile) are read and emitted; a sequence whose token is a stop token or its max_tokens-th leaves now, its
   KV state (every token but that last one) given back, so that no forward pass draws it a token nobody reads
   (mlx-lm's BatchGenerator draws one);
2. prefill: the sequences reading their prompts (at most `prefill_batch` at once, in order of arrival) read their
   next chunk of at most `prefill_step` tokens each, side by side (padded to the longest chunk); those with only
   their last token left join the decode rows. While rows decode, with a `decode_floor` (tokens per second), the
   chunks of long prompts are sized so that a step takes at most 1 / decode_floor: after each such step they grow
   or shrink by the ratio of that bound to the step's time (at most doubling; 16 tokens at least, so that a prompt
   always progresses), so long prompts read beside the streams slow them to the floor at worst, however many
   arrive. A prompt of one chunk (`prefill_step` tokens or fewer: a question) reads whole in one step: a crowd of
   questions arriving may slow the streams for the steps that read them, not longer. A prompt with images reads
   beside them, one at a time, in chunks of its input embeddings (its images as the vision model sees them,
   computed as its first chunk is read): the others go on decoding while it reads, and it joins the decode rows as
   any other;
3. decode: what each decode row reads next (its token just read; a newcomer's last prompt token) goes through the
   model together, and the draws are started on the device, not waited for. A newcomer's first token is thus
   drawn in the very step its prompt is read, and emitted at the start of the next one.

Per sequence: its sampler, its logits processors (called with every token in its KV cache and the one being read),
its stop tokens and its max_tokens.

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
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import maybe_set_recommended_wired_limit

from worker.batch.rows import MIN_CHUNK, Batching, Counters, Embeds, Emitted, Processor, Row
from worker.batch.sampling import Sampler


class ContinuousBatch:
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
        self.batching = batching
        self.decode_floor = decode_floor  # tokens/s the decode rows keep while prompts are read (0: no floor)
        self.chunk = prefill_step  # a reader's chunk while rows decode (fitted to the floor after each such step)
        self.prefill_batch = 1 if batching == "alone" else prefill_batch
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

    def close(self) -> None:
        """Give back the wired-memory limit it set (on Metal), once the device is done with its work."""
        if self._wired is not None:
            mx.synchronize(generation_stream)
            mx.set_wired_limit(self._wired)
            self._wired = None

    def __len__(self) -> int:
        return len(self._waiting) + len(self._seeing) + len(self._reading) + len(self._rows)

    # --- joining and leaving -------------------------------------------------------------------------------

    def insert(
        self,
        prompt: list[int],
        max_tokens: int,
        sampler: Sampler,
        processors: Sequence[Processor] = (),
        stops: frozenset[int] = frozenset(),
        cache: list[Any] | None = None,
        cached: list[int] | None = None,
        embeds: Embeds | None = None,
        ids: list[int] | None = None,
    ) -> int:
        """A sequence that reads `prompt` (after the `cached` tokens its `cache` holds), then draws up to
        `max_tokens`; returns its uid. With `embeds`, what computes the input embeddings of the prompt's tokens but its
        last (called as its first chunk is read), and `ids`, those tokens as the model knows them: a prompt with
        images."""
        if not prompt:
            raise ValueError("a sequence needs at least one token to read")
        if max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        uid, self._uids = self._uids, self._uids + 1
        own = cache if cache is not None else make_prompt_cache(self.model, self.max_kv_size)
        row = Row(uid, own, list(cached or []), list(prompt), max_tokens, sampler, tuple(processors), stops)
        if embeds is not None and len(prompt) > 1:
            row.embeds, row.ids = embeds, list(ids or prompt)
            self._seeing.append(row)
        else:
            self._waiting.append(row)
        return uid

    def find(self, uid: int) -> tuple[str, int] | None:
        places = (
            ("waiting", self._waiting),
            ("seeing", self._seeing),
            ("reading", self._reading),
            ("decoding", self._rows),
        )
        for where, rows in places:
            for i, row in enumerate(rows):
                if row.uid == uid:
                    return where, i
        return None

    def extract(self, uid: int) -> tuple[list[Any], list[int]] | None:
        """A copy of a sequence's KV cache and the tokens it holds (the sequence stays); None if it is not here."""
        found = self.find(uid)
        if found is None:
            return None
        where, i = found
        if where in ("waiting", "seeing"):
            row = (self._waiting if where == "waiting" else self._seeing)[i]
            return _copy.deepcopy(row.cache or []), list(row.tokens)
        if where == "reading":
            return self._take(self._reading_cache, i, copy=True), list(self._reading[i].tokens)
        return self._take(self._cache, i, copy=True), list(self._rows[i].tokens)

    def remove(self, uids: Sequence[int], keep: bool = False) -> dict[int, tuple[list[Any], list[int]]]:
        """Take sequences out (a uid not here is passed over); with `keep`, their KV caches and tokens."""
        kept = {uid: found for uid in uids if keep and (found := self.extract(uid)) is not None}
        gone = set(uids)
        self._waiting = deque(r for r in self._waiting if r.uid not in gone)
        self._seeing = deque(r for r in self._seeing if r.uid not in gone)
        self._reading, self._reading_cache = self._filtered(self._reading, self._reading_cache, gone)
        stay = [i for i, r in enumerate(self._rows) if r.uid not in gone]
        if len(stay) < len(self._rows):
            self._keep_rows(stay)
        return kept

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

    def _keep_rows(self, stay: list[int]) -> None:
        """Keep only these decode rows (their order kept)."""
        self._rows = [self._rows[i] for i in stay]
        if not stay:
            self._cache, self._next = [], None
            return
        for c in self._cache:
            c.filter(stay)
        assert self._next is not None
        self._next = self._next[mx.array(stay)]
        mx.async_eval(self._next)  # an array of its own: the next step reads it without waiting for its forward pass

    # --- stepping ------------------------------------------------------------------------------------------

    def step(self) -> list[Emitted]:
        """One step (see the module's docstring); returns the tokens drawn in the step before, as now read."""
        with mx.stream(generation_stream):
            self.work.steps += 1
            began = started = time.perf_counter()
            decoding = bool(self._rows)
            emitted = self._read() if decoding else []
            self.work.decode_s += time.perf_counter() - started
            started = time.perf_counter()
            cap = self.chunk if decoding and self.decode_floor else self.prefill_step
            read = self._prefill(cap) + self._see(cap)
            self.work.prefill_s += time.perf_counter() - started
            started = time.perf_counter()
            if self._rows:
                self._draw()
            self.work.decode_s += time.perf_counter() - started
        if read and decoding and self.decode_floor:
            self._fit_chunk(time.perf_counter() - began)
        return emitted

    def _fit_chunk(self, step_s: float) -> None:
        """After a step that read prompts while rows decoded: the next such step's chunks, in proportion to how far
        this one was from the floor's bound (1 / decode_floor s), at most doubling, within MIN_CHUNK..prefill_step."""
        scaled = int(self.chunk * min(2.0, 1 / (self.decode_floor * max(step_s, 1e-6))))
        self.chunk = max(MIN_CHUNK, min(self.prefill_step, scaled))

    def _read(self) -> list[Emitted]:
        """The tokens the decode rows drew in the step before (computed by now): each is emitted; a row whose token
        is a stop token or its max_tokens-th leaves, its KV state (which holds every token but that last one)
        given back, before any forward pass draws it a token nobody reads; the others read theirs in this step's."""
        assert self._next is not None
        drawn = cast(list[int], self._next.tolist())  # (a vector of token ids: tolist is typed for any shape)
        emitted, stay = [], []
        for i, (row, token) in enumerate(zip(self._rows, drawn)):
            row.generated += 1
            reason = "stop" if token in row.stops else "length" if row.generated >= row.max_tokens else None
            if reason is None:
                emitted.append(Emitted(row.uid, token))
                stay.append(i)
                continue
            cache = self._take(self._cache, i, copy=len(self._rows) > 1)
            emitted.append(Emitted(row.uid, token, reason, cache, list(row.tokens)))
        self.work.generated_tokens += len(emitted)
        if len(stay) < len(self._rows):
            self._keep_rows(stay)
        return emitted

    def _draw(self) -> None:
        """The decode rows' next tokens, started on the device (not waited for): the forward pass over what each
        reads (its last draw, or a newcomer's last prompt token), its logits processors, its sampler."""
        reading = self._next
        assert reading is not None
        logits = self.model(reading[:, None], cache=self._cache)[:, -1, :]
        if any(r.processors for r in self._rows):
            logits = mx.concatenate([self._processed(i, logits[i : i + 1], reading) for i in range(len(self._rows))])
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        samplers = [r.sampler for r in self._rows]
        if all(s is samplers[0] for s in samplers):
            drawn = samplers[0](logprobs)
        else:
            drawn = mx.concatenate([s(logprobs[i : i + 1]) for i, s in enumerate(samplers)])
        mx.async_eval(drawn)
        self._next = drawn
        read = cast(list[int], reading.tolist())  # (known already: draws read, or prompts' tokens)
        for row, token in zip(self._rows, read):
            row.tokens.append(token)

    def _processed(self, i: int, logits: mx.array, reading: mx.array) -> mx.array:
        row = self._rows[i]
        if not row.processors:
            return logits
        context = mx.concatenate([mx.array(row.tokens, dtype=reading.dtype), reading[i : i + 1]])
        for processor in row.processors:
            logits = processor(context, logits)
        return logits

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
        self.model(tokens, cache=self._reading_cache)  # only the caches are evaluated: no logits are computed
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
        if not self._seeing or (self.batching == "alone" and (self._reading or self._rows)):
            return 0
        row = self._seeing[0]
        if callable(row.embeds):  # its first chunk: its images are read now (the vision tower's pass)
            row.embeds = row.embeds()
        assert row.embeds is not None and row.ids is not None and row.cache is not None
        n = min(cap, len(row.unread) - 1)
        if n > 0:
            self.model(mx.array([row.ids[:n]]), cache=row.cache, inputs_embeds=row.embeds[None, :n])
            mx.eval([c.state for c in row.cache])
            mx.clear_cache()
            row.tokens += row.unread[:n]
            del row.unread[:n], row.ids[:n]
            row.embeds = row.embeds[n:]
            self.work.prompt_tokens += n
        if len(row.unread) == 1:
            self._seeing.popleft()
            row.embeds = row.ids = None
            cache, row.cache = row.cache, None
            self._join_decode([row], self._merge([cache]))
        return max(n, 0)

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
        mx.async_eval(self._next)  # (as in _keep_rows)
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
