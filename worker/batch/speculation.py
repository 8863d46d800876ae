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

Which rows propose, and how much (`Proposing`): a row drawn through penalties, biases or recorded log probabilities
(worker/batch/logits.py), or alone in the batch, does not; a row under a grammar does, its proposals checked against it
(worker/grammar.py); every other row proposes up to its own length, which
grows by one after a step that kept all it proposed and falls to what was kept plus one otherwise; a row whose
proposals have been kept at a rate below `MIN_RATE` proposes again only every `PROBE` steps. How wide the block is
(`Payoff`) follows what it costs, measured on the batch's own steps, against what the rows are expected to keep:
the batch backs off as it fills, or where little is kept; rows x width stays within `budget` whatever it measures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

BUDGET = 64  # the most tokens a step that checks proposals reads over all rows (ONELANE_SPECULATE_BUDGET's default)
MIN_RATE = 0.2  # a row whose proposals are kept less often than this proposes only now and then
PROBE = 8  # ... every this many steps
RATE_WEIGHT = 0.3  # how much a step's outcome moves a row's rate, and a step's time the time of its size
REFRESH = 32  # a plain step (one token a row) whose time is older than this many steps is measured again
STALE = 256  # a step size not measured for this many steps is forgotten (tried afresh if it may pay)
MARGIN = 0.03  # a wider step must promise this much more tokens/s than the best narrower one to be chosen
WEIGHT_CAP = 16  # the most a size's steps seen weigh in the line through the measured sizes


@dataclass(frozen=True)
class Speculation:
    """How a batch's sequences speculate: the most tokens one proposes a step (0: none), the most a step reads over
    all, and whether the batch proposes only where it measures that proposing pays (`Payoff`), or always."""

    tokens: int = 0
    budget: int = BUDGET
    measured: bool = True


OFF = Speculation()  # no proposals


class Always:
    """Proposals read whatever they cost (ONELANE_SPECULATE_ALWAYS: to measure what they keep, or test them): a
    step is as wide as its longest proposal, within the budget."""

    def width(self, rows: int, proposals: list[tuple[int, float]], budget: int) -> int:
        return 1 + min(max(0, budget // rows - 1), max((n for n, _ in proposals), default=0))

    def observe(self, rows: int, wide: int, seconds: float) -> None:
        """(Nothing measured.)"""


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


def expected(rate: float, proposed: int) -> float:
    """The tokens a row is expected to keep of `proposed`, each kept (after the one before it) at `rate`."""
    return sum(rate**i for i in range(1, proposed + 1))


@dataclass
class Timed:
    """The seconds a step of one size took (a moving average), the step it was last seen at, and how many seen."""

    seconds: float
    at: int
    seen: int = 1


class Payoff:
    """How wide a step reads, as the batch lives it. What a step costs differs from one machine and model to the
    next (a GPU reads several tokens a row for about one's cost; a CPU's matrix products may not, and the fuller
    the batch the more each token costs), so it is measured, not assumed: the batch times its own steps by their
    rows and width (a moving average a size, forgotten after STALE steps) and fits seconds = fixed + a row's cost x
    rows + a proposal's cost x rows x (width - 1) through them (least squares, no term below zero, each size weighed
    by its steps seen up to WEIGHT_CAP: one slow step, a row leaving, does not make its size look slower than a
    larger one). A row and a proposal are priced apart: a row brings its own cache, draw and bookkeeping, a proposal
    only its place in the matrix products, so a batch whose plain steps grow steeply with its rows may still check
    proposals cheaply. Each step, the width with the most expected tokens per second is chosen: the rows' tokens
    plus what each is expected to keep of its proposals (`expected`, at its kept rate), over its time by the fit,
    or by its own measure where that says a wider step pays less (`_priced`). While no step that checked proposals
    is measured, one of two tokens a row is tried; where no wider step pays (the batch is full, or little is kept),
    the step is plain, and a plain step's time is measured again when older than REFRESH steps, so the fit follows
    the machine's load."""

    def __init__(self) -> None:
        self.steps = 0
        self._times: dict[tuple[int, int], Timed] = {}  # (rows, width) -> its time

    def width(self, rows: int, proposals: list[tuple[int, float]], budget: int) -> int:
        """How wide this step's block is (1: plain), for `rows` decode rows proposing (length, kept rate) each."""
        self.steps += 1
        for size in [k for k, t in self._times.items() if self.steps - t.at > STALE]:
            del self._times[size]
        longest = min(max((n for n, _ in proposals), default=0), budget // rows - 1)
        plain = self._times.get((rows, 1))
        if longest <= 0 or plain is None or self.steps - plain.at > REFRESH:
            return 1
        fit = self.fit()
        if fit is None:
            return 2  # (a step that checks proposals, to price one)
        best, best_speed = 1, rows / self._priced(fit, rows, 1)
        for wide in range(2, longest + 2):
            gain = sum(expected(rate, min(n, wide - 1)) for n, rate in proposals)
            speed = (rows + gain) / self._priced(fit, rows, wide)
            if speed > best_speed * (1 + MARGIN):
                best, best_speed = wide, speed
        return best

    def _priced(self, fit: tuple[float, float, float], rows: int, wide: int) -> float:
        """A step's time, priced against speculation: a plain step at the lower of its measure and the fit, a
        checked one at the higher. A line through sizes where a step's cost bends (a CPU whose products turn
        compute-bound as a step's tokens grow) prices a full batch's checked step below what it costs, and its one
        measure corrects that until forgotten (STALE); one slow plain step (a row had just left) does not make a
        wider one look cheaper."""
        fitted = self.seconds(fit, rows, wide)
        timed = self._times.get((rows, wide))
        if timed is None:
            return fitted
        return max(fitted, timed.seconds) if wide > 1 else min(fitted, timed.seconds)

    @staticmethod
    def seconds(fit: tuple[float, float, float], rows: int, wide: int) -> float:
        """A step's time by the fit: fixed + a row's cost x rows + a proposal's cost x rows x (width - 1)."""
        fixed, row, proposal = fit
        return max(1e-6, fixed + row * rows + proposal * rows * (wide - 1))

    def fit(self) -> tuple[float, float, float] | None:
        """(fixed, a row's cost, a proposal's cost) through the measured sizes, as the class says; None until a
        step that checked proposals is measured."""
        if all(wide == 1 for _, wide in self._times):
            return None
        points = [(rows, wide, t.seconds, min(t.seen, WEIGHT_CAP)) for (rows, wide), t in self._times.items()]
        weight = np.sqrt([w for *_, w in points])
        terms = np.array([[1.0, rows, rows * (wide - 1)] for rows, wide, *_ in points]) * weight[:, None]
        seconds = np.array([t for _, _, t, _ in points]) * weight
        best: tuple[float, tuple[float, float, float]] | None = None
        for kept in TERMS:  # (every choice of terms held; the closest fit with none below zero)
            found = np.linalg.lstsq(terms[:, kept], seconds, rcond=None)[0]
            miss = float(np.sum((terms[:, kept] @ found - seconds) ** 2))
            if (found >= 0).all() and (best is None or miss < best[0] - 1e-15):
                full = np.zeros(3)
                full[kept] = found
                best = (miss, (float(full[0]), float(full[1]), float(full[2])))
        return None if best is None else best[1]

    def observe(self, rows: int, wide: int, seconds: float) -> None:
        """A decode step of `rows` rows, `wide` tokens each, took `seconds`, as the loop lived it."""
        if rows <= 0 or wide <= 0 or seconds <= 0:
            return
        timed = self._times.get((rows, wide))
        if timed is None:
            self._times[rows, wide] = Timed(seconds, self.steps)
        else:
            timed.seconds += RATE_WEIGHT * (seconds - timed.seconds)
            timed.at, timed.seen = self.steps, timed.seen + 1


TERMS = ([0, 1, 2], [0, 2], [1, 2], [0, 1], [2], [0], [1])  # the terms a fit may hold, the fullest first


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


MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers", "mtp_num_layers")


def dropped_heads(folder: str) -> int:
    """How many multi-token-prediction heads the checkpoint in `folder` carries (its config.json, or its text
    model's), none of which speculation uses: every mlx-lm architecture that has them drops their weights as it
    loads (DeepSeek V3/V4, GLM-4.5, MiMo, Qwen3-Next, Qwen 3.5, ERNIE 4.5, ...), so they cannot propose here."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    parts = [config, config.get("text_config")] if isinstance(config, dict) else []
    for part in (p for p in parts if isinstance(p, dict)):
        for key in MTP_KEYS:
            value = part.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return 0


def accepted(proposed: list[int], drawn: list[int]) -> int:
    """How many of a row's proposals are kept: those equal to what it drew at their places, up to the first not."""
    n = 0
    while n < len(proposed) and proposed[n] == drawn[n]:
        n += 1
    return n


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
    rows: list[int] = []  # every moved entry's row, where it is, and where it goes
    sources: list[int] = []
    targets: list[int] = []
    orders = list(orders)
    for row, (hole, start) in enumerate(zip(holes, starts)):
        if not hole:
            continue
        held = end - hole - start
        count = min(held, hole)
        rows += [row] * count
        sources += range(start, start + count)
        targets += range(end - count, end)
        order = orders[row] or []
        order = order + list(range(len(order), held))  # (entries past a row's order are in order)
        orders[row] = order[count:] + order[:count]
    shift = mx.array(holes)
    if rows:
        # the moved entries are read out first (all layers at once), so that writing them back finds each layer's
        # keys and values held by nothing else and writes in place, rather than copying a whole layer per move
        # (all three axes indexed by arrays, broadcast to (entries, heads): MLX writes no other mix of them)
        heads = mx.arange(cache[0].keys.shape[1])[None, :]
        at, source, target = mx.array(rows)[:, None], mx.array(sources)[:, None], mx.array(targets)[:, None]
        moved = [(c.keys[at, heads, source], c.values[at, heads, source]) for c in cache]
        mx.eval(moved)
        for c, (keys, values) in zip(cache, moved):
            c.keys[at, heads, target] = keys
            c.values[at, heads, target] = values
    for c in cache:
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
