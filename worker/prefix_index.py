"""The prefix cache's lookup (worker/prefix_cache.py): of the token sequences kept, which share the most first tokens
with a prompt.

One key's sequences are kept sorted. In that order the ones that share the most first tokens with a prompt stand
beside the place the prompt would take, and all that start the same way stand together. A lookup is then a few
binary searches at the pace of C's tuple comparisons: 0.1 ms among 2,000 entries of about 1,000 tokens, where a scan
of every entry in Python took 25 ms, and with no trie of a dict a token (mlx-lm's, hundreds of bytes a token kept).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable

Marks = tuple[tuple[int, str], ...]  # where each image of a sequence starts, and its full digest
Tokens = tuple[int, ...]


def shared(a: Tokens, b: Tokens) -> int:
    """How many first tokens `a` and `b` share (by halving: slices compare in C, a loop a token would be Python)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 1:  # a[:lo] == b[:lo], and they differ before hi
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class SortedSequences:
    """One key's token sequences, sorted, each at most once."""

    def __init__(self) -> None:
        self._sorted: list[Tokens] = []

    def __len__(self) -> int:
        return len(self._sorted)

    def add(self, tokens: Tokens) -> None:
        insort(self._sorted, tokens)

    def remove(self, tokens: Tokens) -> None:
        del self._sorted[bisect_left(self._sorted, tokens)]

    def most_shared(self, prompt: Tokens) -> int:
        """The most first tokens any sequence shares with `prompt`: one of the two beside its place has them."""
        at = bisect_left(self._sorted, prompt)
        return max((shared(prompt, s) for s in self._sorted[max(at - 1, 0) : at + 1]), default=0)

    def starting_with(self, start: Tokens) -> list[Tokens]:
        """The sequences that begin with `start` (they stand together)."""
        head = len(start)
        lo = bisect_left(self._sorted, start, key=lambda s: s[:head])
        return self._sorted[lo : bisect_right(self._sorted, start, lo=lo, key=lambda s: s[:head])]

    def prefixes_of(self, tokens: Tokens) -> list[Tokens]:
        """The sequences that `tokens` begins with and goes on past (they stand before it, not together)."""
        before = self._sorted[: bisect_left(self._sorted, tokens)]
        return [s for s in before if len(s) < len(tokens) and tokens[len(s) - 1] == s[-1] and tokens[: len(s)] == s]


def within(reach: int, held: Marks, prompt: Marks) -> int:
    """How much of a cached sequence a prompt may read, of the `reach` tokens they share: up to the first image whose
    full digest differs (their tokens name an image by a short tag; an entry's `held` marks name them whole)."""
    mine = dict(prompt)
    for at, digest in held:
        if at < reach and mine.get(at) != digest:
            return at
    return reach


def nearest(
    held: SortedSequences, prompt: Tokens, trimmable: Callable[[Tokens], bool], least: int
) -> tuple[Tokens, int] | None:
    """Of `held`, the sequence that holds the most of `prompt` but its last token (at least `least` of them), and
    how many it holds: of equals the shortest (the least to copy and trim); one that goes on past them only if its
    state can be trimmed back."""
    reach = min(held.most_shared(prompt), len(prompt) - 1)
    if reach < least:
        return None
    best = min(held.starting_with(prompt[:reach]), key=len)
    if len(best) == reach or trimmable(best):
        return best, reach
    within = [s for s in held.prefixes_of(prompt) if len(s) >= least]  # (no trimming needed)
    return (within[-1], len(within[-1])) if within else None
