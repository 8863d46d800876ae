"""How a model's sequences share the batch, found as it loads, before its first job (worker/batch/prefill.py's
`Batching`): the architecture's batched forward pass is tried against its own forward pass alone, and the first way
that gives each sequence the logits it has alone is kept.

Two prompts of different lengths (chunked small, so that chunks of different lengths are read side by side, a
prompt goes on reading after the other joined the decode rows, and the two then decode side by side: `_shapes`, at
whatever chunk the model reads prompts in) each read alone, then together, `padded` first, then
`unpadded`; each sequence is fed the same scripted tokens in every run (so a near tie cannot send two runs apart),
and its log-probabilities at every draw are compared with its own alone, over the tokens the alone run finds
likely. A batched run that raises, or strays past the tolerance, is not used; `padded` is kept if within it (unless
`unpadded` is ten times closer); if neither is right, the model's sequences run `alone`, one at a time, on the caches mlx-lm's generate_step would give them. A model whose caches
mlx-lm cannot merge (Llama 4's chunked one), or whose batched form the trial cannot check (a sparse attention's
indexer, which picks keys only past more than the trial reads: worker/batch/rows.py `unchecked`), runs alone without
a trial.

This is what lets an architecture mlx-lm adds work the day it ships: a cache type whose batched form is missing or
wrong for it costs that model its batching, not its answers. tests/test_architectures.py holds every architecture of
the installed mlx-lm to it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from worker.batch.forward import ContinuousBatch
from worker.batch.rows import Batching, unchecked, unmergeable

logger = logging.getLogger(__name__)

LENGTHS = (3, 10)  # the trial's prompts, in tokens (the shorter at most the chunk: see _shapes)
CHUNK = 8  # its prefill step: chunks of 2 and 8 tokens read side by side, then the longer's last one while the other
#            decodes (each forward pass of a real model costs ~a decode step: the trial keeps to a dozen of them)
DRAWS = 3  # draws compared per sequence (the shorter's more: see _shapes)
LIKELY = 10.0  # compared: the tokens within this many nats of the alone run's likeliest
# How far apart a sequence's log-probabilities may be, alone and batched, in nats: float32's own rounding (a batch
# changes the shapes of the sums) stays near 1e-6 in the tiny models and 7e-5 through SmolLM2's 30 layers;
# Nemotron-H's padded prompt reads were 2e-3 off, enough to change a greedy answer. A lower precision rounds more
# coarsely, so a wrong cache must stray further there to be seen (padded reads within it are kept unless unpadded
# ones are ten times closer).
TOLERANCE = {mx.float32: 5e-4}
LOW_PRECISION_TOLERANCE = 0.1


@dataclass(frozen=True, kw_only=True)
class Trial:
    batching: Batching
    why: str  # what the trial saw, for the log and the model's record
    seconds: float


class _Scripted:
    """A sampler that keeps the log-probabilities it is given and draws the tokens of its script, in turn."""

    def __init__(self, script: list[int]) -> None:
        self.script, self.dtype = script, mx.float32
        self.seen: list[mx.array] = []

    def __call__(self, logprobs: mx.array) -> mx.array:
        self.dtype = logprobs.dtype
        self.seen.append(logprobs.astype(mx.float32))
        return mx.array([self.script[len(self.seen) - 1]], dtype=mx.uint32)


def choose(model: nn.Module, vocab: int, max_kv_size: int | None = None, chunk: int = CHUNK) -> Trial:
    """The way `model`'s sequences share a batch (see the module's docstring), its prompts read in chunks of at most
    `chunk` tokens (a model that reads prompts a token a step, worker/batch/chunking.py, is tried so too)."""
    chunk = max(min(chunk, CHUNK), 1)
    started = time.perf_counter()
    kinds = unmergeable(model)
    if kinds:
        why = f"mlx-lm cannot merge its caches ({', '.join(kinds)})"
        return Trial(batching="alone", why=why, seconds=time.perf_counter() - started)
    kinds = unchecked(model)
    if kinds:
        why = f"its caches pick keys by an indexer only past more keys than the trial reads ({', '.join(kinds)})"
        return Trial(batching="alone", why=why, seconds=time.perf_counter() - started)
    rng = np.random.default_rng(0)
    shapes = _shapes(chunk)
    prompts = [[int(t) for t in rng.integers(1, vocab, n)] for n, _ in shapes]
    scripts = [[int(t) for t in rng.integers(1, vocab, draws)] for _, draws in shapes]
    runs = [_run(model, [p], [s], "alone", max_kv_size, chunk) for p, s in zip(prompts, scripts)]
    alone = [seen[0] for seen, _ in runs]
    tolerance = TOLERANCE.get(runs[0][1], LOW_PRECISION_TOLERANCE)
    seen, found = [], {}
    for way in ("padded", "unpadded"):
        try:
            together = _run(model, prompts, scripts, way, max_kv_size, chunk)[0]
        except Exception as exc:  # an architecture whose batched step fails: it is not batched that way
            seen.append(f"{way}: its step fails ({type(exc).__name__}: {str(exc)[:120]})")
            continue
        found[way] = _apart(alone, together)
        seen.append(f"{way}: {found[way]:.2g} nats from its logits alone")
        if found[way] <= tolerance / 10:  # as alone, to the precision's own noise: no need to look further
            break
    batching: Batching = "alone"
    if found.get("unpadded", tolerance + 1) <= tolerance:
        batching = "unpadded"
    if found.get("padded", tolerance + 1) <= tolerance and not found.get("padded", 0) > 10 * found.get("unpadded", 1):
        batching = "padded"  # (unless unpadded reads are ten times closer: a wrong cache within the tolerance)
    return Trial(batching=batching, why="; ".join(seen), seconds=time.perf_counter() - started)


def _shapes(chunk: int) -> tuple[tuple[int, int], ...]:
    """The trial's prompts for a prefill step of `chunk`, each as (its length, its draws). The shorter one's read (all
    of it but its last token) is shorter than the longer one's first chunk, so that padding goes through the model
    beside a real read; and it draws on until the longer one has read its prompt and drawn beside it, so that the two
    decode side by side (their caches merged, the shorter's padded). (A short prompt of 3 beside chunks of 2 read 2
    tokens as the long one did, and ended before the long one decoded: no padding tried, and Mamba's padded reads and
    AFM's shared keys, wrong in a batch, were kept.)"""
    short, long = LENGTHS
    reading = -(-(long - 1) // chunk)  # the longer prompt's steps before it decodes
    return ((min(short, chunk), DRAWS + reading), (long, DRAWS))


def _run(
    model: nn.Module,
    prompts: list[list[int]],
    scripts: list[list[int]],
    batching: Batching,
    max_kv_size: int | None,
    chunk: int = CHUNK,
) -> tuple[list[list[np.ndarray]], mx.Dtype]:
    """Each prompt's log-probabilities at each draw, read together in one batch the `batching` way; the logits'
    dtype."""
    batch = ContinuousBatch(model, chunk, len(prompts), max_kv_size, batching)
    samplers = [_Scripted(s) for s in scripts]
    try:
        for prompt, sampler in zip(prompts, samplers):
            batch.insert(prompt, len(sampler.script), sampler)
        for _ in range(4 * (max(LENGTHS) // chunk + max(len(s) for s in scripts) + 2) * len(prompts)):
            if not len(batch):
                break
            batch.step()
        else:
            raise RuntimeError("the trial's sequences did not end")
    finally:
        batch.close()
    return [[np.array(s[0]) for s in sampler.seen] for sampler in samplers], samplers[0].dtype


def _apart(alone: list[list[np.ndarray]], together: list[list[np.ndarray]]) -> float:
    """The largest difference, in nats, between a sequence's log-probabilities alone and together, over the tokens
    its alone run finds likely."""
    worst = 0.0
    for mine, theirs in zip(alone, together):
        if len(mine) != len(theirs):
            return float("inf")
        for a, b in zip(mine, theirs):
            likely = a >= a.max() - LIKELY
            apart = float(np.abs(a[likely] - b[likely]).max())
            if np.isnan(apart):
                return float("inf")
            worst = max(worst, apart)
    return worst
