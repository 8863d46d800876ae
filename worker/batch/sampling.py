"""How a sequence draws its tokens, and how a job's runs agree on it: its sampler (temperature, top_p, top_k, and a
random key of its own when it has a seed: the global random state is never used for a seeded job); and a prompt's
scoring (echo), read outside the batch."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Protocol

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import apply_top_k, apply_top_p, greedy_sampler

from tasks.job import Job, SamplingParams
from tasks.logprobs import TokenLogprob
from worker.token_bytes import TokenBytes

Sampler = Callable[[mx.array], mx.array]


def make_sampler(params: SamplingParams, drawn: int = 0) -> Sampler:
    """The sampler of one sequence. A seeded one draws from its own key, split at every token, so its output
    depends on its seed and prompt only; `drawn`: the tokens it already sampled (a run that goes on from an earlier
    run's tokens), so its key is where that run's was."""
    if params.temperature == 0:
        return greedy_sampler
    if params.seed is None:
        return Unseeded(params)
    return Seeded(params, drawn)


class Unseeded:
    """A sampled sequence without a seed of its own: the global random state draws (never a job's: `sampling`)."""

    def __init__(self, params: SamplingParams) -> None:
        self.temp, self.top_p, self.top_k = params.temperature, params.top_p, params.top_k

    def _filtered(self, logprobs: mx.array) -> mx.array:
        if 0 < self.top_k < logprobs.shape[-1]:
            logprobs = apply_top_k(logprobs, self.top_k)
        if self.top_p < 1.0:
            logprobs = apply_top_p(logprobs, self.top_p)
        return logprobs * (1 / self.temp)

    def __call__(self, logprobs: mx.array) -> mx.array:
        return mx.random.categorical(self._filtered(logprobs))


class Seeded(Unseeded):
    """A seeded sampled sequence: its n-th token is drawn with the n-th key of its seed's chain (each split from the
    one before), whatever else the step reads; so that several places may be drawn at once (`ahead`: a step that
    checks proposed tokens, worker/batch/speculation.py) and their keys taken only for the tokens kept (`skip`),
    giving the very tokens a token-a-step run draws."""

    def __init__(self, params: SamplingParams, drawn: int = 0) -> None:
        super().__init__(params)
        assert params.seed is not None
        self.key = mx.random.key(params.seed)
        if drawn:
            self.skip(drawn)
            mx.eval(self.key)  # (a resumed run's: its chain of splits computed once, not carried into every draw)

    def __call__(self, logprobs: mx.array) -> mx.array:
        self.key, draw = mx.random.split(self.key)
        return mx.random.categorical(self._filtered(logprobs), key=draw)

    def ahead(self, logprobs: mx.array) -> mx.array:
        """The tokens drawn from each row of `logprobs` (this place and the next ones'), its key unmoved."""
        key, drawn = self.key, []
        for i in range(logprobs.shape[0]):
            key, draw = mx.random.split(key)
            drawn.append(mx.random.categorical(self._filtered(logprobs[i : i + 1]), key=draw))
        return mx.concatenate(drawn)

    def skip(self, n: int) -> None:
        """Its key moves past `n` draws (tokens kept): computed with the next draw, not waited for between steps."""
        for _ in range(n):
            self.key, _ = mx.random.split(self.key)


def sampling(job: Job) -> SamplingParams:
    """How every run of a job samples: a sampled job without a seed draws from a seed of its own, taken from its id,
    so that a run after a requeue writes what the run before it wrote (an OpenAI stream goes on where it was). A job
    whose answer follows a grammar ends where the grammar does, ignore_eos or not."""
    params = job.spec.params
    if job.spec.constraint is not None and params.ignore_eos:  # a complete grammar ends the answer, as EOS does
        params = params.model_copy(update={"ignore_eos": False})
    if params.seed is not None or params.temperature == 0:
        return params
    seed = int.from_bytes(hashlib.blake2b(job.id.encode(), digest_size=4).digest(), "big")
    return params.model_copy(update={"seed": seed})


class Reader(Protocol):
    """What a Scorer reads a prompt with: a model as the engine holds it (worker/batch/engine.py's Engine)."""

    model: nn.Module
    max_kv_size: int | None
    prefill_step: int
    token_bytes: TokenBytes

    def entries(self, rows: mx.array, tokens: list[int], top: int) -> list[str]: ...


class Scorer:
    """A prompt read outside the batch, a chunk at a time (`advance`, between the batch's steps, so that a long one
    stalls no one), recording each token's log probability (tasks/logprobs.py entries; the first's is None: nothing
    predicts it) and the `top` likeliest at its place, as the model gives them (no penalty or bias: they apply to
    what is generated). Once `done`: `entries` (one JSON list) and `cache`, the KV state of the prompt's first
    len - 1 tokens, for the sequence to generate from (its last is read as its first step)."""

    def __init__(self, engine: Reader, prompt: list[int], top: int) -> None:
        self.engine, self.prompt, self.top = engine, prompt, top
        self.cache = make_prompt_cache(engine.model, engine.max_kv_size)
        self._entries = [TokenLogprob(engine.token_bytes[prompt[0]], None).encode()]
        self._at = 0

    @property
    def done(self) -> bool:
        return self._at >= len(self.prompt) - 1

    @property
    def entries(self) -> str:
        return "[" + ",".join(self._entries) + "]"

    def advance(self) -> None:
        """Read the next chunk of the prompt (each token predicts the next); nothing once done (a one-token prompt
        is done at once: nothing of it is read here, its token is the sequence's first step)."""
        if self.done:
            return
        e, at = self.engine, self._at
        chunk = self.prompt[at : min(at + e.prefill_step, len(self.prompt) - 1)]
        logits = e.model(mx.array([chunk]), cache=self.cache)[0].astype(mx.float32)
        rows = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        self._entries += e.entries(rows, self.prompt[at + 1 : at + 1 + len(chunk)], self.top)
        self._at += len(chunk)
