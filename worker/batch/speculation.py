"""Speculation inside the continuous batch: each decode row may read, beside its next token, tokens proposed for
after it (worker/batch/lookup.py), and one forward pass checks every row's proposals at once.

A step that speculates reads a (rows x width) block: a row's next token, then its proposals, padded to the widest.
At each place the row draws as it would have drawn there, token by token (greedy: the likeliest; seeded: with the
key of that place, `Seeded.ahead`), so a proposal is kept while it equals what the row draws, and the row's first
draw that differs (or the one after its last proposal) is its own next token: a step gives each row its kept
proposals plus one, the very tokens a token-a-step run gives (lossless: greedy equal token for token; a seeded
sampled answer equal too, each token drawn from the model's distribution with its own key).

What the block wrote into the batch's KV cache past a row's kept tokens must go (`cut`). mlx-lm's batched cache
(`BatchKVCache`) holds every row right-aligned at one shared end, each row's start its left padding, so a row cannot
be cut alone. All rows are cut by the fewest discarded, and a row that discards more has its holes filled with its
own first cached entries, moved into them: attention reads a row's cached keys as a set (each key carries its
position, rotated in when written), so their order in the cache changes nothing, and the row's start moves right
past them (more left padding). Only a few entries a row move, not the row's cache. The row's order is kept
(`Row.order`) and put back when its cache leaves the batch (a copy taken for the prefix cache is cut from its end).

Which rows propose, and how much (`Proposals`): a row that samples with logits processors (penalties, a grammar,
recorded log probabilities) or alone in the batch does not; every other row proposes up to its own length, which
grows by one after a step that kept all it proposed and falls to what was kept plus one otherwise; a row whose
proposals have been kept at a rate below `MIN_RATE` proposes again only every `PROBE` steps. The block's width is
capped so that rows x width stays within `budget` (the forward pass's tokens where it still costs about one step:
the batch backs off as it fills).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

BUDGET = 16  # the most tokens a step that checks proposals reads over all rows (ONELANE_SPECULATE_BUDGET's default)
PLAIN_EVERY = 16  # every this many steps, one proposes nothing: the tokens/s of plain steps stays known
PAUSE = 256  # steps that propose nothing at a batch size where proposing was seen to be slower
SAMPLES = 4  # steps of each kind seen at a batch size before the two are compared
MARGIN = 0.02  # proposing must make tokens/s at least this much better, or it stops for a while
MIN_RATE = 0.2  # a row whose proposals are kept less often than this proposes only now and then
PROBE = 8  # ... every this many steps
RATE_WEIGHT = 0.3  # how much a step's outcome moves a row's rate


@dataclass
class Proposing:
    """One row's speculation: its proposal length and kept rate, and what it proposed and kept so far."""

    length: int
    rate: float = 0.5
    quiet: int = 0  # steps since it last proposed, while its rate is low
    proposed: int = 0
    accepted: int = 0

    def wants(self) -> int:
        """How many tokens it proposes this step (0: none)."""
        if self.rate >= MIN_RATE:
            return self.length
        self.quiet += 1
        if self.quiet >= PROBE:
            self.quiet = 0
            return 1
        return 0

    def kept(self, proposed: int, accepted: int, most: int) -> None:
        """A step's outcome: `accepted` of `proposed` kept; its length follows (at most `most`)."""
        if not proposed:
            return
        self.proposed += proposed
        self.accepted += accepted
        self.rate += RATE_WEIGHT * (accepted / proposed - self.rate)
        self.length = min(most, self.length + 1) if accepted == proposed else max(1, accepted + 1)


@dataclass
class Speed:
    """Tokens per second of a kind of step at one batch size (a moving average), and the steps seen."""

    rate: float = 0.0
    seen: int = 0

    def add(self, rate: float) -> None:
        self.seen += 1
        self.rate = rate if self.seen == 1 else self.rate + RATE_WEIGHT * (rate - self.rate)


class Payoff:
    """Whether proposing pays, as the batch lives it: the tokens per second of its steps that checked proposals and
    of plain ones (one step in PLAIN_EVERY proposes nothing, so both stay known), by batch size; where proposing
    gives fewer (less than MARGIN better), the batch proposes nothing at that size for PAUSE steps, then tries
    again. The forward pass's cost per token read differs from one machine and model to the next (a GPU reads
    several tokens a row for about one's cost; a CPU's matrix products may not): this measures it rather than
    assume it."""

    def __init__(self) -> None:
        self.steps = 0
        self._speeds: dict[tuple[int, bool], Speed] = {}
        self._paused: dict[int, int] = {}  # batch size -> the step it may propose again

    def allows(self, rows: int) -> bool:
        """Whether a step of `rows` decode rows may propose (counts the step)."""
        self.steps += 1
        if self.steps % PLAIN_EVERY == 0 or self._paused.get(rows, 0) > self.steps:
            return False
        plain, checked = self._speeds.get((rows, False)), self._speeds.get((rows, True))
        if plain is None or checked is None or min(plain.seen, checked.seen) < SAMPLES:
            return True
        if checked.rate >= plain.rate * (1 + MARGIN):
            return True
        self._paused[rows] = self.steps + PAUSE
        del self._speeds[(rows, True)]  # (tried afresh after the pause)
        return False

    def observe(self, rows: int, checked: bool, tokens: int, seconds: float) -> None:
        """A step of `rows` decode rows (that checked proposals, or not) gave `tokens` in `seconds`."""
        if rows and seconds > 0:
            self._speeds.setdefault((rows, checked), Speed()).add(tokens / seconds)


def refusal(model: nn.Module, batching: str, max_kv_size: int | None) -> str | None:
    """Why a model's sequences cannot check proposals in the batch (None: they can): its batched caches must be
    cut a row at a time, which mlx-lm's `BatchKVCache` allows and a recurrent state (Mamba, linear attention), a
    rotating window or a sequence alone on its own caches do not; and its positions must be its tokens' (not a
    vision model's M-RoPE, which worker/batch/positions.py computes a row at a time)."""
    if getattr(model, "positional", False):
        return "its positions depend on its images"
    if batching != "padded":
        return f"its sequences share the batch {batching}"
    kinds = sorted({type(c).__name__ for c in make_prompt_cache(model, max_kv_size)} - {"KVCache"})
    if kinds:
        return f"its caches ({', '.join(kinds)}) cannot be cut a sequence at a time"
    return None


def accepted(proposed: list[int], drawn: list[int]) -> int:
    """How many of a row's proposals are kept: those equal to what it drew at their places, up to the first not."""
    n = 0
    while n < len(proposed) and proposed[n] == drawn[n]:
        n += 1
    return n


def width(proposals: list[list[int]], budget: int) -> int:
    """The block's width: one, plus the longest proposal, within `budget` tokens over all rows."""
    most = max(0, budget // max(1, len(proposals)) - 1)
    return 1 + min(most, max((len(p) for p in proposals), default=0))


def cut(cache: list[Any], discarded: list[int], orders: list[list[int] | None]) -> list[list[int] | None]:
    """Drop each row's last `discarded` entries from a batched KV cache (one `BatchKVCache` per layer), as the
    module's docstring says; returns each row's order of cached entries afterwards (None: in order)."""
    least = min(discarded)
    if least:
        for c in cache:
            c.trim(least)
    holes = [d - least for d in discarded]
    if not any(holes):
        return orders
    end = cache[0]._idx
    starts = [int(s) for s in cache[0].left_padding.tolist()]
    moves: list[tuple[int, int, int, int]] = []  # (row, from, to, count)
    orders = list(orders)
    for row, (hole, start) in enumerate(zip(holes, starts)):
        if not hole:
            continue
        held = end - hole - start
        count = min(held, hole)
        moves.append((row, start, end - count, count))
        order = orders[row] or []
        order = order + list(range(len(order), held))  # (entries past a row's order are in order)
        orders[row] = order[count:] + order[:count]
    shift = mx.array(holes)
    for c in cache:
        for row, source, target, count in moves:
            c.keys[row : row + 1, :, target : target + count, :] = c.keys[row : row + 1, :, source : source + count, :]
            c.values[row : row + 1, :, target : target + count, :] = c.values[
                row : row + 1, :, source : source + count, :
            ]
        c.left_padding = c.left_padding + shift
        c.offset = c.offset - shift
    return orders


def in_order(cache: list[Any], order: list[int] | None) -> list[Any]:
    """A row's KV cache taken out of the batch (a `KVCache` per layer), its entries put back in order (`order`:
    where each of its first entries belongs; those past it are in order)."""
    if not order:
        return cache
    held = int(cache[0].keys.shape[2])
    where = list(range(held))
    for slot, position in enumerate(order):
        where[position] = slot
    take = mx.array(where)
    for c in cache:
        c.keys = mx.contiguous(mx.take(c.keys, take, axis=2))
        c.values = mx.contiguous(mx.take(c.values, take, axis=2))
    return cache
