"""The prefix cache's lookup: kept sorted, the sequences that share the most first tokens with a prompt are found
beside its place, those that start alike together, and those it starts with before it; as a scan of all would."""

from __future__ import annotations

import random

from worker.prefix_index import SortedSequences, shared


def counted(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """The first tokens two sequences share, counted one by one."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_the_lookup_finds_what_a_scan_of_every_sequence_finds():
    # Given sequences of a small alphabet (so that many share long starts), some added and later removed
    rng = random.Random(0)
    held, kept = SortedSequences(), set()
    for seq in {tuple(rng.randrange(3) for _ in range(rng.randrange(1, 12))) for _ in range(300)}:
        held.add(seq)
        kept.add(seq)
    for seq in rng.sample(sorted(kept), 60):
        held.remove(seq)
        kept.discard(seq)

    for _ in range(300):
        prompt = tuple(rng.randrange(3) for _ in range(rng.randrange(1, 14)))
        # When a prompt is looked up, Then the lookup agrees with a scan
        most = max(counted(prompt, s) for s in kept)
        assert shared(prompt, max(kept, key=lambda s: counted(prompt, s))) == most
        assert held.most_shared(prompt) == most
        assert held.starting_with(prompt[:most]) == sorted(s for s in kept if s[:most] == prompt[:most])
        assert held.prefixes_of(prompt) == sorted(s for s in kept if len(s) < len(prompt) and prompt[: len(s)] == s)
    assert len(held) == len(kept)
