"""A draft model: a smaller model with the served model's tokenizer proposes each decode row's next tokens (its
greedy continuation), which the served model checks in the step's one forward pass (worker/batch/speculation.py).

Each row the draft follows keeps the draft's own KV cache (`Draft`), which follows the row's tokens: what the row
kept since, the draft reads at its next proposal; what it proposed and the row did not keep is trimmed off first
(its cache back to the longest prefix it shares with the row). So the draft reads each token of a row once, but
for its proposals that were not kept.

It runs inside the batch's step, on the worker's one device thread, as the served model does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, make_prompt_cache, trim_prompt_cache
from mlx_lm.tokenizer_utils import TokenizerWrapper

from worker.batch.dtypes import with_dtype
from worker.batch.proposers import Follower
from worker.unsupported import Unsupported

CHUNK = 512  # the most tokens of a row the draft reads in one forward pass (a prompt, the first time)
BESIDE = 8  # the most unread tokens a row reads beside the others (more: all but these first, alone)


class Draft:
    """One row as the draft follows it: the row's tokens (those its KV cache holds and the one it reads next), and
    the draft's KV cache with the tokens that cache holds (`held`: a prefix of the row's, then its own proposals)."""

    def __init__(self, model: nn.Module, tokens: Iterable[int]) -> None:
        self.tokens = list(tokens)
        self.cache: list[Any] = make_prompt_cache(model)
        self.held: list[int] = []
        self.known = 0  # of `held`, the first that are the row's tokens (a row's tokens only grow: no need to look)

    def extend(self, tokens: Iterable[int]) -> None:
        """Tokens added to the row."""
        self.tokens += tokens

    def unread(self, model: nn.Module) -> list[int]:
        """The row's tokens the draft has still to read, at least its last (whose logits give the first proposal),
        at most BESIDE: its cache trimmed back to the longest prefix it shares with the row's tokens, and, past
        BESIDE, all but the last BESIDE read now, alone."""
        shared = self.known
        for mine, theirs in zip(self.held[shared:], self.tokens[shared:]):
            if mine != theirs:
                break
            shared += 1
        shared = min(shared, len(self.tokens) - 1)
        trim_prompt_cache(self.cache, len(self.held) - shared)
        ahead = len(self.tokens) - BESIDE
        for start in range(shared, ahead, CHUNK):
            model(mx.array([self.tokens[start : min(start + CHUNK, ahead)]]), cache=self.cache)
            mx.eval([c.state for c in self.cache])
        shared = max(shared, ahead)
        self.held, self.known = self.tokens[:shared], shared
        return self.tokens[shared:]


class Drafter:
    """A draft model proposing for a batch's rows (worker/batch/proposers.py's `Proposer`): its KV caches merged
    into one batched cache a layer (mlx-lm's `BatchKVCache`, the rows left-padded to the longest), one forward pass
    a proposed token over all rows, and each row's cache taken out of it again."""

    costly = True

    def __init__(self, model: nn.Module, name: str) -> None:
        self.model, self.name = model, name

    def follow(self, tokens: list[int]) -> Draft:
        return Draft(self.model, tokens)

    def propose(self, followers: Sequence[Follower | None], wants: list[int]) -> list[list[int]]:
        proposing = [i for i, (f, k) in enumerate(zip(followers, wants)) if isinstance(f, Draft) and k > 0]
        proposals: list[list[int]] = [[] for _ in followers]
        if not proposing:
            return proposals
        drafts = [cast(Draft, followers[i]) for i in proposing]
        drawn = self._drafted(drafts, max(wants[i] for i in proposing))
        for i, draft, tokens in zip(proposing, drafts, drawn):
            draft.held, draft.known = draft.tokens + tokens[:-1], len(draft.tokens)
            proposals[i] = tokens[: wants[i]]
        return proposals

    def _drafted(self, drafts: list[Draft], k: int) -> list[list[int]]:
        """Each row's `k` next tokens, as the draft continues it greedily: each reads what it has not read yet
        (right-padded to the longest, as worker/batch/prefill.py reads prompts), then the tokens drawn, together."""
        unread = [d.unread(self.model) for d in drafts]
        lengths = [len(u) for u in unread]
        padding = [max(lengths) - n for n in lengths]
        layers = zip(*(d.cache for d in drafts))  # (each layer's caches, a row each)
        cache = drafts[0].cache if len(drafts) == 1 else [layer[0].merge(list(layer)) for layer in layers]
        if max(padding):
            for c in cache:
                c.prepare(lengths=lengths, right_padding=padding)
        logits = self.model(mx.array([u + [0] * p for u, p in zip(unread, padding)]), cache=cache)
        if max(padding):
            for c in cache:
                c.finalize()
        drawn = [mx.argmax(logits[mx.arange(len(drafts)), mx.array(lengths) - 1], axis=-1)]
        for _ in range(k - 1):
            drawn.append(mx.argmax(self.model(drawn[-1][:, None], cache=cache)[:, -1, :], axis=-1))
        tokens = cast(list[list[int]], mx.stack(drawn, axis=1).tolist())  # (ids, rows x k: tolist is typed for any)
        if len(drafts) > 1:
            for j, draft in enumerate(drafts):
                draft.cache = [c.extract(j) for c in cache]
        return tokens


def load_drafter(path: str, dtype: str, served: str, tokenizer: TokenizerWrapper) -> Drafter:
    """The draft model at `path` (a folder or what mlx_lm.load takes), its weights in the served model's `dtype`
    (worker/batch/dtypes.py); Unsupported, naming both, if it cannot draft for the served model `served` (of
    `tokenizer`): another vocabulary or other end tokens, or caches that cannot be trimmed."""
    from mlx_lm import load

    name = draft_name(path)
    model, theirs = load(path)[:2]
    with_dtype(model, dtype)
    mine, other = tokenizer.vocab, theirs.vocab
    if mine != other:
        raise Unsupported(
            f"the draft model {name} cannot draft for {served}: its tokenizer's vocabulary ({len(other)} tokens) is "
            f"not {served}'s ({len(mine)} tokens); a draft must have the served model's tokenizer"
        )
    if set(theirs.eos_token_ids) != set(tokenizer.eos_token_ids):
        raise Unsupported(
            f"the draft model {name} cannot draft for {served}: its end tokens {sorted(theirs.eos_token_ids)} are "
            f"not {served}'s {sorted(tokenizer.eos_token_ids)}; a draft must have the served model's tokenizer"
        )
    kinds = untrimmable(model)
    if kinds:
        raise Unsupported(
            f"the draft model {name} cannot draft for {served}: its caches ({', '.join(kinds)}) cannot be trimmed "
            "back to the tokens kept; a draft must be an attention model whose caches are all mlx-lm's KVCache"
        )
    return Drafter(model, name)


def draft_name(path: str) -> str:
    """How a draft is named to clients: a local folder by its name (never a server path), else as written (a
    Hugging Face id)."""
    folder = Path(path)
    return folder.name if folder.is_dir() else path


def untrimmable(model: nn.Module) -> list[str]:
    """The kinds of `model`'s caches that are not mlx-lm's `KVCache` (none: it can be a draft, its cache trimmed
    back to any length)."""
    return sorted({type(c).__name__ for c in make_prompt_cache(model) if type(c) is not KVCache})
