"""Prompt lookup: a sequence's next tokens proposed from its own prompt and answer, with no extra weights.

Copy-heavy work (an agent re-emitting a file it was shown, a JSON document rewritten, an answer quoting its sources)
writes tokens that already stand in its context. Where the last few tokens written occurred before, the tokens that
followed them then are a good guess of what follows now: the guess is checked in the next step's one forward pass
(worker/batch/speculation.py), and what the model agrees with is kept.

`Lookup` keeps, for every n-gram of NGRAMS lengths, where it last ended in the sequence, updated as tokens are
added (a dict per length: a prompt of 10,000 tokens is indexed once, in a few milliseconds). A proposal follows the
longest n-gram that ends the sequence and occurred before, from its latest earlier occurrence.
"""

from __future__ import annotations

from collections.abc import Iterable

NGRAMS = (4, 3, 2)  # the n-gram lengths looked up, longest first (a single token matches too often to pay)


class Lookup:
    """The n-gram index of one sequence's tokens (see the module's docstring)."""

    def __init__(self, tokens: Iterable[int] = ()) -> None:
        self.tokens: list[int] = []
        self._last: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in NGRAMS}  # n-gram -> where it ended
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Tokens added to the sequence (its prompt, then what it generates)."""
        for token in tokens:
            # the n-grams ending at the token before are indexed now: the one ending the sequence is looked up, not
            # indexed, so that a lookup never finds the sequence's own end
            self._index(len(self.tokens))
            self.tokens.append(token)

    def _index(self, end: int) -> None:
        for n, last in self._last.items():
            if end >= n:
                last[tuple(self.tokens[end - n : end])] = end

    def propose(self, k: int) -> list[int]:
        """Up to `k` tokens that followed the longest n-gram ending the sequence where it last occurred before;
        none if no such n-gram did."""
        if k <= 0:
            return []
        end = len(self.tokens)
        for n, last in self._last.items():
            if end < n:
                continue
            found = last.get(tuple(self.tokens[end - n :]))
            if found is not None:
                return self.tokens[found : min(found + k, end)]
        return []
