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


class Draft:
    """One row as the draft follows it: the row's tokens (those its KV cache holds and the one it reads next), and
    the draft's KV cache with the tokens that cache holds (`held`: a prefix of the row's, then its own proposals)."""

    def __init__(self, model: nn.Module, tokens: Iterable[int]) -> None:
        self.tokens = list(tokens)
        self.cache: list[Any] = make_prompt_cache(model)
        self.held: list[int] = []

    def extend(self, tokens: Iterable[int]) -> None:
        """Tokens added to the row."""
        self.tokens += tokens

    def unread(self) -> list[int]:
        """The row's tokens the draft has still to read, at least its last (whose logits give the first proposal):
        its cache trimmed back to the longest prefix it shares with the row's tokens."""
        shared = 0
        for mine, theirs in zip(self.held, self.tokens):
            if mine != theirs:
                break
            shared += 1
        shared = min(shared, len(self.tokens) - 1)
        trim_prompt_cache(self.cache, len(self.held) - shared)
        self.held = self.held[:shared]
        return self.tokens[shared:]


class Drafter:
    """A draft model proposing for a batch's rows (worker/batch/proposers.py's `Proposer`)."""

    costly = True

    def __init__(self, model: nn.Module, name: str) -> None:
        self.model, self.name = model, name

    def follow(self, tokens: list[int]) -> Draft:
        return Draft(self.model, tokens)

    def propose(self, followers: Sequence[Follower | None], wants: list[int]) -> list[list[int]]:
        return [self._propose(f, k) if isinstance(f, Draft) and k > 0 else [] for f, k in zip(followers, wants)]

    def _propose(self, draft: Draft, k: int) -> list[int]:
        """A row's `k` next tokens, as the draft continues it greedily."""
        unread = draft.unread()
        for start in range(0, len(unread) - 1, CHUNK):
            self.model(mx.array([unread[start : min(start + CHUNK, len(unread) - 1)]]), cache=draft.cache)
        logits = self.model(mx.array([unread[-1:]]), cache=draft.cache)
        drawn = [mx.argmax(logits[:, -1, :], axis=-1)]
        for _ in range(k - 1):
            drawn.append(mx.argmax(self.model(drawn[-1][:, None], cache=draft.cache)[:, -1, :], axis=-1))
        proposal = cast(list[int], mx.concatenate(drawn).tolist())  # (a vector of ids: tolist is typed for any shape)
        draft.held = draft.tokens + proposal[:-1]
        return proposal


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
