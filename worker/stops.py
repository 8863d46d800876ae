"""Stop strings, matched by onelane: mlx-lm stops only on EOS tokens."""

from __future__ import annotations


class StopMatcher:
    """Feed generated text; get back the text that is safe to show and whether a stop string was hit.

    Text that could be the start of a stop string is held back until it is known not to be one, so a
    client never sees part of a stop string, and the output ends right before the first match.
    """

    def __init__(self, stops: tuple[str, ...] | list[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.matched: str | None = None  # the stop string hit, once one is (the first in the text)

    def feed(self, text: str) -> tuple[str, bool]:
        if not self.stops:
            return text, False
        buffer = self._held + text
        hits = [(i, s) for i, s in ((buffer.find(s), s) for s in self.stops) if i >= 0]
        if hits:
            self._held = ""
            at, self.matched = min(hits, key=lambda hit: hit[0])
            return buffer[:at], True
        keep = self._longest_partial(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """The held-back text, once generation ended without a match."""
        held, self._held = self._held, ""
        return held

    def _longest_partial(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buffer)), best, -1):
                if buffer.endswith(stop[:n]):
                    best = n
                    break
        return best
