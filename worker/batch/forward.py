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
2. prefill: the sequences reading their prompts read their next chunk, side by side; those with only their last
   token left join the decode rows (worker/batch/prefill.py says how many read at once, how long their chunks
   are, and how a prompt with images reads);
3. decode: what each decode row reads next (its token just read; a newcomer's last prompt token) goes through the
   model together, and the draws are started on the device, not waited for. A newcomer's first token is thus
   drawn in the very step its prompt is read, and emitted at the start of the next one.

Per sequence: its sampler, its logits processors (called with every token in its KV cache and the one being read),
its stop tokens and its max_tokens.

Where each sequence is, how the prompts are read, and how a model's sequences share the batch (`Batching`:
`padded`, `unpadded` or `alone`, decided as the model loads: worker/batch/sharing.py): worker/batch/prefill.py,
the part of the batch it stands on.
"""

from __future__ import annotations

import copy as _copy
import dataclasses
import itertools
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import mlx.core as mx
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache
from mlx_lm.sample_utils import greedy_sampler

from worker.batch.positions import Positions
from worker.batch.prefill import Prefilling
from worker.batch.proposers import PromptLookup, Proposer
from worker.batch.rows import MIN_CHUNK, Checking, Embeds, Emitted, Processor, Row
from worker.batch.sampling import Sampler, Seeded
from worker.batch.speculation import (
    OFF,
    Always,
    Payoff,
    Proposing,
    Speculation,
    accepted,
    cut,
    expected,
    in_order,
    refusal,
)


class ContinuousBatch(Prefilling):
    """The continuous batch (see the module's docstring): sequences join and leave it, and each step reads what the
    decode rows drew, reads a chunk of the joining prompts and draws the decode rows' next tokens."""

    def __init__(
        self, *args: Any, speculation: Speculation = OFF, proposer: Proposer | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.proposer = proposer or PromptLookup()  # where proposals come from (worker/batch/proposers.py)
        # the most tokens a decode row proposes a step, and the most a step reads over all rows (0: no speculation,
        # worker/batch/speculation.py)
        self.speculate, self.budget = speculation.tokens, speculation.budget
        self.refusal = refusal(self.model, self.batching, self.max_kv_size) if self.speculate else "off"
        self._proposed: list[list[int]] | None = None  # what each decode row proposed in the step before
        # how wide a step reads, by what it costs as measured on the batch's steps (worker/batch/speculation.py)
        self.payoff: Payoff | Always = Payoff() if speculation.measured else Always()
        # the last step's start, whether it read prompts, and the tokens its decode rows read (rows x width)
        self._cycle: tuple[float, bool, int, int] | None = None  # (began, read prompts, rows, width)
        self._vocab = 0  # the ids the model scores (its logits' width, once seen): a proposal holds none past them
        self._least = 1.0  # the tokens the last draw is expected to give the decode row it gives the fewest

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
        alone: bool = False,
        positions: Positions | None = None,
    ) -> int:
        """A sequence that reads `prompt` (after the `cached` tokens its `cache` holds), then draws up to
        `max_tokens`; returns its uid. With `embeds`, what computes the input embeddings of the prompt's tokens but its
        last (called as its first chunk is read), and `ids`, those tokens as the model knows them: a prompt with
        images (`alone`: one that runs with nothing beside it, worker/batch/prefill.py); `positions`, its own, for a
        model whose positions depend on its images (worker/batch/positions.py)."""
        if not prompt:
            raise ValueError("a sequence needs at least one token to read")
        if max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        uid, self._uids = self._uids, self._uids + 1
        own = cache if cache is not None else make_prompt_cache(self.model, self.max_kv_size)
        row = Row(uid, own, list(cached or []), list(prompt), max_tokens, sampler, tuple(processors), stops)
        row.positions = positions
        if embeds is not None and (len(prompt) > 1 or alone):
            row.embeds, row.ids, row.alone = embeds, list(ids or prompt), alone
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
        return self._row_cache(i, copy=True), list(self._rows[i].tokens)

    def _row_cache(self, i: int, copy: bool) -> list[Any]:
        """Decode row `i`'s KV cache, out of the batch, its entries in order, without what a step checking proposals
        wrote past its tokens (read at the next step)."""
        cache = in_order(self._take(self._cache, i, copy=copy), self._rows[i].order)
        if self._proposed is not None:
            trim_prompt_cache(cache, max(len(p) for p in self._proposed))
        return cache

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

    def _keep_rows(self, stay: list[int]) -> None:
        """Keep only these decode rows (their order kept)."""
        self._rows = [self._rows[i] for i in stay]
        if self._proposed is not None:
            self._proposed = [self._proposed[i] for i in stay]
        if not stay:
            self._cache, self._next, self._proposed = [], None, None
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
            decoding, after_checked = bool(self._rows), self._proposed is not None
            emitted = self._read() if decoding else []
            self.work.decode_s += time.perf_counter() - started
            if decoding and self._cycle is not None and not self._cycle[1]:  # (a step that read prompts: no measure)
                self.payoff.observe(self._cycle[2], self._cycle[3], time.perf_counter() - self._cycle[0])
            started = time.perf_counter()
            cap = self.chunk if decoding and self.decode_floor else self.prefill_step
            read = self._prefill(cap) + self._see(cap)
            self.work.prefill_s += time.perf_counter() - started
            started = time.perf_counter()
            wide = self._draw() if self._rows else 0
            self.work.decode_s += time.perf_counter() - started
        self._cycle = (began, read > 0, len(self._rows), wide)
        # (the step's time includes the wait for the step before's draws: a plain step after one that checked
        # proposals, wider, would shrink the chunks for a cost that is not theirs)
        if read and decoding and self.decode_floor and (wide > 1 or not after_checked):
            self._fit_chunk(time.perf_counter() - began)
        return emitted

    def _fit_chunk(self, step_s: float) -> None:
        """After a step that read prompts while rows decoded: the next such step's chunks, in proportion to how far
        this one was from the floor's bound, at most doubling, within MIN_CHUNK..prefill_step. The bound is the time
        in which the decode row expected to get the fewest tokens from this step gets them at the floor's rate:
        1 / decode_floor s for a plain step, longer for one that checks every row's proposals (`_least`)."""
        scaled = int(self.chunk * min(2.0, self._least / (self.decode_floor * max(step_s, 1e-6))))
        self.chunk = max(min(MIN_CHUNK, self.prefill_step), min(self.prefill_step, scaled))

    def _read(self) -> list[Emitted]:
        """The tokens the decode rows drew in the step before (computed by now): each is emitted; a row whose token
        is a stop token or its max_tokens-th leaves, its KV state (which holds every token but that last one)
        given back, before any forward pass draws it a token nobody reads; the others read theirs in this step's."""
        if self._proposed is not None:
            return self._read_checked()
        assert self._next is not None
        drawn = cast(list[int], self._next.tolist())  # (a vector of token ids: tolist is typed for any shape)
        emitted, stay = [], []
        for i, (row, token) in enumerate(zip(self._rows, drawn)):
            row.generated += 1
            reason = "stop" if token in row.stops else "length" if row.generated >= row.max_tokens else None
            if reason is None:
                emitted.append(Emitted(row.uid, token))
                stay.append(i)
                if row.lookup is not None:
                    row.lookup.extend([token])
                continue
            cache = self._row_cache(i, copy=len(self._rows) > 1)
            emitted.append(Emitted(row.uid, token, reason, cache, list(row.tokens)))
        self.work.generated_tokens += len(emitted)
        if len(stay) < len(self._rows):
            self._keep_rows(stay)
        return emitted

    def _read_checked(self) -> list[Emitted]:
        """As `_read`, after a step that checked proposals (worker/batch/speculation.py): each row's kept proposals
        and its own next draw are emitted (up to a stop token or its max_tokens-th), and what the step wrote past
        them is cut from the cache."""
        assert self._next is not None and self._proposed is not None
        drawn = cast(list[list[int]], self._next.tolist())
        proposals, self._proposed = self._proposed, None
        emitted: list[list[Emitted]] = []
        kept, nexts, stay, ends, counts = [], [], [], {}, []
        for i, (row, out, proposal) in enumerate(zip(self._rows, drawn, proposals)):
            right = accepted(proposal, out)
            counts.append((len(proposal), right))
            self.work.proposed_tokens += len(proposal)
            self.work.accepted_tokens += right
            if row.proposing is not None:
                row.proposing.kept(len(proposal), right, self.speculate)
            tokens, reason = self._ended(row, out[: right + 1])
            kept.append(len(tokens))
            row.tokens += proposal[: len(tokens) - 1]
            for processor in row.processors if proposal else ():  # (those of a row that proposes check proposals)
                cast(Checking, processor).keep(proposal[: len(tokens) - 1])
            if isinstance(row.sampler, Seeded):
                row.sampler.skip(len(tokens))
            emitted.append([Emitted(row.uid, t) for t in tokens[: -1 if reason else None]])
            nexts.append(tokens[-1])
            if reason is None:
                stay.append(i)
                if row.lookup is not None:
                    row.lookup.extend(tokens)
            else:
                ends[i] = (tokens[-1], reason)
        width = len(drawn[0])
        orders = cut(self._cache, [width - n for n in kept], [r.order for r in self._rows])
        for row, order in zip(self._rows, orders):
            row.order = order
        for i, (token, reason) in ends.items():
            row = self._rows[i]
            cache = self._row_cache(i, copy=len(self._rows) > 1)
            emitted[i].append(Emitted(row.uid, token, reason, cache, list(row.tokens)))
        for row_emitted, (proposed, right) in zip(emitted, counts):
            if proposed:
                row_emitted[0] = dataclasses.replace(row_emitted[0], proposed=proposed, accepted=right)
        flat = [e for row_emitted in emitted for e in row_emitted]
        self.work.generated_tokens += len(flat)
        self._next = mx.array(nexts, dtype=mx.uint32)
        if len(stay) < len(self._rows):
            self._keep_rows(stay)
        return flat

    @staticmethod
    def _ended(row: Row, tokens: list[int]) -> tuple[list[int], str | None]:
        """A row's tokens of a step, up to the first that ends it (a stop token, its max_tokens-th), and why."""
        for n, token in enumerate(tokens, 1):
            row.generated += 1
            reason = "stop" if token in row.stops else "length" if row.generated >= row.max_tokens else None
            if reason is not None:
                return tokens[:n], reason
        return tokens, None

    def _draw(self) -> int:
        """The decode rows' next tokens, started on the device (not waited for): the forward pass over what each
        reads (its last draw, or a newcomer's last prompt token), its logits processors, its sampler; with the
        tokens proposed for after it, where rows propose (worker/batch/speculation.py). Returns the tokens each row
        read (1, or the block's width)."""
        reading = self._next
        assert reading is not None
        proposals = self._proposals(reading)
        if proposals:
            return self._draw_checked(reading, proposals)
        self._least = 1.0
        logits = self._forward(reading[:, None], self._cache, self._rows, **self._beside())[:, -1, :]
        self._vocab = logits.shape[-1]
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
        self._read_into_rows(reading)
        return 1

    def _read_into_rows(self, reading: mx.array) -> None:
        read = cast(list[int], reading.tolist())  # (known already: draws read, or prompts' tokens)
        for row, token in zip(self._rows, read):
            row.tokens.append(token)

    def _proposals(self, reading: mx.array) -> list[list[int]] | None:
        """What each decode row proposes for after the token it reads now, cut to the step's width; None where
        none does (or the batch cannot check proposals: its caches cannot be cut a row at a time)."""
        if self.refusal is not None or not self._vocab or self._beside():
            return None
        wants: list[int] = []
        read: list[int] | None = None
        for i, row in enumerate(self._rows):
            if row.proposing is None and _proposes(row):
                read = read or cast(list[int], reading.tolist())
                row.lookup, row.proposing = self.proposer.follow([*row.tokens, read[i]]), Proposing(self.speculate)
            wants.append(row.proposing.wants() if row.proposing is not None and row.lookup is not None else 0)
        rates = [r.proposing.rate if r.proposing is not None else 0.0 for r in self._rows]
        if self.proposer.costly:  # (a draft's: as many as each wants, a forward pass a token: the width first)
            most = self._most(wants, rates)
            if most <= 0:
                return None
            wants = [min(n, most) for n in wants]
        proposals = self.proposer.propose([r.lookup for r in self._rows], wants)
        # (an image's tags, ids past the vocabulary, are no token to read: worker/vision.py)
        proposals = [list(itertools.takewhile(lambda t: t < self._vocab, p)) for p in proposals]
        if any(p and row.processors for p, row in zip(proposals, self._rows)):
            read = read or cast(list[int], reading.tolist())
            proposals = [_allowed(row, token, p) for row, token, p in zip(self._rows, read, proposals)]
        if not self.proposer.costly:
            most = self._most([len(p) for p in proposals], rates)
        if most <= 0:
            return None
        return [p[:most] for p in proposals]

    def _most(self, lengths: list[int], rates: list[float]) -> int:
        """The most tokens a row proposes this step (`Payoff`), for rows proposing `lengths` at their kept `rates`."""
        return self.payoff.width(len(self._rows), list(zip(lengths, rates)), self.budget) - 1

    def _draw_checked(self, reading: mx.array, proposals: list[list[int]]) -> int:
        """As `_draw`, each row reading its proposals after its token: what it draws at every place, to be checked
        against them as the next step reads them. Returns the block's width."""
        wide = 1 + max(len(p) for p in proposals)
        after = mx.array([p + [0] * (wide - 1 - len(p)) for p in proposals], dtype=reading.dtype)
        block = mx.concatenate([reading[:, None], after], axis=1)
        logits = self._forward(block, self._cache, self._rows, **self._beside())
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        drawn = mx.stack([self._drawn_at(i, logits, logprobs, reading, p, wide) for i, p in enumerate(proposals)])
        mx.async_eval(drawn)
        self._next, self._proposed = drawn, proposals
        self._least = min(
            1 + expected(r.proposing.rate, len(p)) if r.proposing is not None else 1.0
            for r, p in zip(self._rows, proposals)
        )
        self._read_into_rows(reading)
        return wide

    def _drawn_at(
        self, i: int, logits: mx.array, logprobs: mx.array, reading: mx.array, proposal: list[int], wide: int
    ) -> mx.array:
        """Row `i`'s draws at the places of the block it proposed for (its token's, then each proposal's; padded to
        `wide`): a row that proposes draws at each as it would token by token (its processors, a grammar, masking
        each place as it stands after the proposals before it); any other only at its first, as in a plain step."""
        row = self._rows[i]
        places = len(proposal) + 1
        if row.processors:
            if proposal:
                context = mx.concatenate([mx.array(row.tokens, dtype=reading.dtype), reading[i : i + 1]])
                processed = logits[i, :places]
                for processor in row.processors:
                    processed = cast(Checking, processor).ahead(context, processed, proposal)
            else:
                processed = self._processed(i, logits[i, :1], reading)
            row_logprobs = processed - mx.logsumexp(processed, axis=-1, keepdims=True)
        else:
            row_logprobs = logprobs[i, :places]
        if row.sampler is greedy_sampler:
            drawn = mx.argmax(row_logprobs, axis=-1)
        elif isinstance(row.sampler, Seeded):
            drawn = row.sampler.ahead(row_logprobs)
        else:
            drawn = row.sampler(row_logprobs[:1])
        drawn = drawn.reshape(-1).astype(mx.uint32)
        return mx.concatenate([drawn, mx.zeros((wide - drawn.shape[0],), dtype=mx.uint32)])

    def _processed(self, i: int, logits: mx.array, reading: mx.array) -> mx.array:
        row = self._rows[i]
        if not row.processors:
            return logits
        context = mx.concatenate([mx.array(row.tokens, dtype=reading.dtype), reading[i : i + 1]])
        for processor in row.processors:
            logits = processor(context, logits)
        return logits


def _allowed(row: Row, read: int, proposal: list[int]) -> list[int]:
    """A row's proposal cut to what its processors (a grammar) allow after the token it reads now."""
    for processor in row.processors if proposal else ():
        proposal = proposal[: cast(Checking, processor).valid(read, proposal)]
    return proposal


def _proposes(row: Row) -> bool:
    """Whether a decode row may propose tokens: it draws greedily or with a seed of its own (not through penalties,
    biases or recorded log probabilities: worker/batch/logits.py), its logits processors check proposals (a grammar's),
    and it is not alone in the batch."""
    plain = row.sampler is greedy_sampler or isinstance(row.sampler, Seeded)
    checked = all(isinstance(p, Checking) for p in row.processors)
    return plain and checked and not row.alone and row.beside is None
