"""Where a batch's proposals come from (worker/batch/speculation.py): prompt lookup (worker/batch/lookup.py), the
default, or a draft model (worker/batch/drafting.py).

A proposer follows each decode row that proposes (`follow`: its state, kept on the row as `Row.lookup` and told the
tokens the row adds, `extend`), and proposes for all the rows of a step at once (`propose`): a draft model then runs
one forward pass a proposed token over all rows, not one a row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from worker.batch.lookup import Lookup


class Follower(Protocol):
    """One row's proposer state: the row's tokens (those its KV cache holds, then the one it reads next), as added."""

    tokens: list[int]

    def extend(self, tokens: Iterable[int]) -> None:
        """Tokens added to the row (what a step kept of it)."""
        ...


class Proposer(Protocol):
    """What proposes the decode rows' next tokens. `costly`: proposing costs a forward pass a token (a draft model),
    and it proposes as many as asked: the step's width is chosen before it proposes, from what each row wants, so
    that a plain step drafts nothing; else (prompt lookup: it finds what it finds, for nothing) after."""

    costly: bool

    def follow(self, tokens: list[int]) -> Follower:
        """A row's state, from the tokens it holds and the one it reads next."""
        ...

    def propose(self, followers: Sequence[Follower | None], wants: list[int]) -> list[list[int]]:
        """Each row's proposals for after its tokens: up to `wants` of them (none for a row of none: None, or 0)."""
        ...


class PromptLookup:
    """Proposals from each row's own prompt and answer (worker/batch/lookup.py)."""

    costly = False

    def follow(self, tokens: list[int]) -> Lookup:
        return Lookup(tokens)

    def propose(self, followers: Sequence[Follower | None], wants: list[int]) -> list[list[int]]:
        return [f.propose(k) if isinstance(f, Lookup) else [] for f, k in zip(followers, wants)]
