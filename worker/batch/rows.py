"""What the continuous batch (worker/batch/forward.py) keeps of each sequence, what a step gives back, and the
work it counts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from worker.batch.positions import Positions
from worker.batch.proposers import Follower
from worker.batch.sampling import Sampler
from worker.batch.speculation import Proposing

MIN_CHUNK = 16  # the fewest prompt tokens a reader reads in a step, however far its step runs past the floor
Processor = Callable[[mx.array, mx.array], mx.array]
Batching = Literal["padded", "unpadded", "alone"]


@runtime_checkable
class Checking(Protocol):
    """A logits processor that lets its sequence propose (worker/batch/speculation.py): a grammar's matcher
    (worker/grammar.py), which checks proposals against the grammar and masks each place of a step's block."""

    def __call__(self, context: mx.array, logits: mx.array) -> mx.array: ...

    def valid(self, read: int, proposal: list[int]) -> int:
        """How many of the proposal's first tokens it allows after the token read now."""
        ...

    def ahead(self, context: mx.array, logits: mx.array, proposal: list[int]) -> mx.array:
        """The block's logits (a row a place: the read token's, then each proposal's), processed place by place."""
        ...

    def keep(self, tokens: list[int]) -> None:
        """The proposals kept, after the step that checked them."""
        ...


class Extras(Protocol):
    """What a prompt's read passes the model beside its input embeddings, chunk by chunk (worker/vision_extras.py)."""

    def take(self, start: int, length: int) -> dict[str, Any]:
        """The model's keyword arguments for the embeddings' tokens start .. start + length."""
        ...


@dataclass(frozen=True)
class Beside:
    """What a sequence's forward passes take beside its input embeddings (Llama 3.2 Vision's cross-attention states
    and masks: worker/vision_reading.py): at its prompt's reads and its first decode step (`prompt`), and at every
    later step (`step`). Such a sequence decodes alone (`Row.alone`)."""

    prompt: dict[str, mx.array]
    step: dict[str, mx.array]


# a prompt's input embeddings (and what its passes take beside them, if anything: `Beside` for a sequence
# alone, `Extras` for its prompt's read), computed when first read: a part a
# call (None until the last: its images read one a step, worker/vision_tower.py)
Embeds = Callable[[], mx.array | tuple[mx.array, Beside | Extras] | None]


def unmergeable(model: nn.Module) -> list[str]:
    """The kinds of `model`'s caches that mlx-lm cannot merge into a batched one (its sequences must run alone)."""
    return sorted({type(c).__name__ for c in make_prompt_cache(model) if not hasattr(c, "merge")})


def unchecked(model: nn.Module) -> list[str]:
    """The kinds of `model`'s caches whose batched form the batching trial (worker/batch/sharing.py) cannot check, so
    its sequences run alone: a cache that keeps an indexer's keys (`update_indexer`: sparse attention, each sequence
    attending only to the blocks of keys its indexer picks) picks none until a sequence holds more keys than its
    budget (thousands in a real model), far past the trial's prompts. (mlx-vlm's Qwen4-Exp, for one, attends to every
    key in a batched decode step whose sequences differ in length: a batched sequence past its budget answers
    otherwise than alone.)"""
    return sorted({type(c).__name__ for c in make_prompt_cache(model) if hasattr(c, "update_indexer")})


@dataclass
class Row:
    """One sequence: what it has read (`tokens`, its KV cache's), what it has still to read, and how it draws."""

    uid: int
    cache: list[Any] | None  # its own KV cache until it joins a batched one
    tokens: list[int]  # the tokens its KV cache holds
    unread: list[int]  # prompt tokens still to read (its last one is read as its first decode row)
    max_tokens: int
    sampler: Sampler
    processors: Sequence[Processor]
    stops: frozenset[int]
    generated: int = 0
    # a prompt with images (worker/vision.py): the input embeddings of its unread tokens but the last, and their ids
    # as the model knows them (its own `unread` names each image's tokens by the image's digest)
    embeds: mx.array | Embeds | None = None
    ids: list[int] | None = None
    # a model whose positions depend on the images (worker/batch/positions.py): this sequence's own (None: text)
    positions: Positions | None = None
    extras: Extras | None = None  # what its prompt's read passes beside its embeddings (from its unread tokens on)
    seen: int = 0  # of its embeddings, those read already (where `extras` are taken from)
    beside: Beside | None = None  # what its passes take beside its embeddings, once read
    alone: bool = False  # it decodes with nothing beside it (the batch drains first; none joins until it leaves)
    # speculation (worker/batch/speculation.py): its proposer's state (an n-gram index, or a draft model's KV cache:
    # worker/batch/proposers.py) and how it proposes (None: it does not), and where its first cached entries belong
    # once entries were moved within the batch's cache (None: in order)
    lookup: Follower | None = None
    proposing: Proposing | None = None
    order: list[int] | None = None


@dataclass(frozen=True)
class Emitted:
    """A token a sequence drew, and, if it was its last, why (`stop`, `length`) and its KV state with its tokens."""

    uid: int
    token: int
    finish_reason: str | None = None
    cache: list[Any] | None = None
    tokens: list[int] | None = None
    proposed: int = 0  # (on a sequence's first token of a step that checked proposals) the tokens it proposed
    accepted: int = 0  # ... and those kept


@dataclass
class Counters:
    """Work done since a batch (or an engine, or a worker) was made; never decreasing."""

    steps: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    decode_s: float = 0.0
    prefill_s: float = 0.0
    proposed_tokens: int = 0  # tokens proposed for the decode rows to check (worker/batch/speculation.py)
    accepted_tokens: int = 0  # ... and kept

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            steps=self.steps + other.steps,
            generated_tokens=self.generated_tokens + other.generated_tokens,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            decode_s=self.decode_s + other.decode_s,
            prefill_s=self.prefill_s + other.prefill_s,
            proposed_tokens=self.proposed_tokens + other.proposed_tokens,
            accepted_tokens=self.accepted_tokens + other.accepted_tokens,
        )
