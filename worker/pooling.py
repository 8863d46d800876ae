"""Embedding models and rerankers on the device: loaded with mlx-vlm's loaders (its model classes, pooling as the
folder's sentence-transformers files name it), their jobs read beside the batch, a slice at a time.

A pooled job generates nothing: each of its inputs (a text, token ids, or a query and document pair) is one
sequence read in one forward pass. Sequences of many jobs, of one model, share a pass, padded on the right to the
longest with an attention mask (the model sees none of the padding: a vector or a score is the same alone and in
a pass, within float error). A pass holds at most PASS_TOKENS tokens, padding included, so the decode steps of the
batch go on between passes however much pooled work waits.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from tasks.catalogue import ModelConfig
from tasks.errors import InvalidRequest
from tasks.job import Job, Pooled
from tasks.model_kind import NAMES, Kind
from tasks.pooled import embeddings_output, scores_output
from worker.batch.dtypes import with_dtype
from worker.batch.rows import Counters
from worker.unsupported import Unsupported

logger = logging.getLogger(__name__)

PASS_TOKENS = 4096  # tokens in one pass, padding included (a sequence longer than that is read alone)
PADDING_MOST = 1.25  # a pass's padded tokens at most this many times its real ones (the rest wait for a pass nearer)
MAX_LENGTH = 8192  # the longest input read, whatever the tokenizer claims


class PoolingUnsupported(Unsupported):
    """The folder is an embedding model or a reranker that cannot be served here; says what, and what to do."""


@dataclass
class Pooler:
    """A loaded embedding model or reranker, in the model pool beside the generating engines."""

    name: str
    model: nn.Module
    tokenizer: Any  # transformers' tokenizer of the folder
    kind: Kind  # "embed" or "rerank"
    max_length: int
    counters: Counters = field(default_factory=Counters)
    batching: str = ""  # (an engine's: how its sequences share the batch; a pooler has none)

    @classmethod
    def load(cls, config: ModelConfig) -> Pooler:
        folder = Path(config.path)
        if not folder.is_dir():
            raise PoolingUnsupported(f"an {config.kind} model is served from a local folder; {config.path} is none")
        try:
            from mlx_vlm.embedding_loader import load_embedding_model
            from mlx_vlm.models.pooling import read_pooling_config
            from mlx_vlm.reranker_loader import load_sequence_classification_model
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise PoolingUnsupported(
                f"embedding models and rerankers are loaded by mlx-vlm, which is not installed ({exc.name}): "
                "install onelane with its `kinds` extra (pip install 'onelane[kinds]')"
            ) from None
        started = time.perf_counter()
        try:
            if config.kind == "embed":
                model = load_embedding_model(folder)
                model.pooling_config = read_pooling_config(folder)
            else:
                model = load_sequence_classification_model(folder)
        except (ValueError, NotImplementedError) as exc:  # mlx-vlm's refusals: an architecture or pooling it lacks
            raise PoolingUnsupported(f"mlx-vlm cannot load it as {NAMES[config.kind]}: {str(exc)[:300]}") from None
        tokenizer = AutoTokenizer.from_pretrained(folder)
        dtype = with_dtype(model, config.dtype)
        limit = getattr(tokenizer, "model_max_length", MAX_LENGTH)
        max_length = min(int(limit) if isinstance(limit, int) and limit > 0 else MAX_LENGTH, MAX_LENGTH)
        logger.info(
            "model %s (%s) loaded from %s in %.2f s (%s)",
            config.name,
            NAMES[config.kind],
            folder,
            time.perf_counter() - started,
            dtype,
        )
        return cls(config.name, model, tokenizer, config.kind, max_length)

    def configure(
        self, max_batch: int, prefill_step: int, decode_floor: float = 0.0, speculation: tuple[int, int] = (0, 0)
    ) -> None:
        """(As an engine's: a pooler's passes are bounded by PASS_TOKENS; it generates nothing to speculate on.)"""

    def close(self) -> None:
        """(As an engine's: nothing held beyond its weights.)"""

    @property
    def vocab(self) -> int:
        return len(self.tokenizer)

    def sequences(self, pooled: Pooled) -> list[Sequence]:
        """The sequences a job's inputs make, or InvalidRequest naming the input the model cannot take."""
        if pooled.kind != self.kind:
            raise InvalidRequest(f"the model {self.name} is not {NAMES[pooled.kind]}", param="model")
        out = []
        for n, text in enumerate(pooled.texts):
            if pooled.kind == "embed":
                ids = list(text) if isinstance(text, tuple) else self.tokenizer(text)["input_ids"]
                types = None
            else:
                encoded = self.tokenizer(pooled.query, text)
                ids, types = encoded["input_ids"], encoded.get("token_type_ids")
            what = "input" if pooled.kind == "embed" else "documents"
            if not ids:
                raise InvalidRequest(f"{what}[{n}] makes no token", param=what)
            if len(ids) > self.max_length:
                raise InvalidRequest(
                    f"{what}[{n}] is {len(ids)} tokens long; the model {self.name} reads at most {self.max_length}",
                    param=what,
                )
            if max(ids) >= self.vocab:
                raise InvalidRequest(f"{what}[{n}] names token {max(ids)}; the vocabulary has {self.vocab}", param=what)
            out.append(Sequence(ids, types))
        return out

    def forward(self, sequences: list[Sequence]) -> list[np.ndarray]:
        """One pass: each sequence's vector (embed) or its relevance logit (rerank), as float32."""
        started = time.perf_counter()
        width = max(len(s.ids) for s in sequences)
        ids = np.zeros((len(sequences), width), dtype=np.int32)
        mask = np.zeros((len(sequences), width), dtype=np.int32)
        types = np.zeros((len(sequences), width), dtype=np.int32)
        for row, s in enumerate(sequences):
            ids[row, : len(s.ids)] = s.ids
            mask[row, : len(s.ids)] = 1
            if s.types is not None:
                types[row, : len(s.types)] = s.types
        if self.kind == "embed":
            out = self.model(mx.array(ids), attention_mask=mx.array(mask)).text_embeds
        else:
            inputs = {"input_ids": mx.array(ids), "attention_mask": mx.array(mask)}
            if any(s.types is not None for s in sequences):
                inputs["token_type_ids"] = mx.array(types)
            out = self.model(**inputs)
            out = getattr(out, "logits", out).reshape(len(sequences), -1)[:, 0]
        values = np.array(out.astype(mx.float32))
        read = int(mask.sum())
        self.counters = self.counters + Counters(prompt_tokens=read, prefill_s=time.perf_counter() - started)
        return list(values)


@dataclass
class Sequence:
    ids: list[int]
    types: list[int] | None = None  # a pair's token types, for a reranker that has them


@dataclass
class PooledRun:
    """A pooled job being read: its sequences, and what each gave so far."""

    job: Job
    pooler: Pooler
    sequences: list[Sequence]
    results: list[np.ndarray | None]
    next: int = 0  # its first sequence not taken into a pass yet
    taken: set[int] = field(default_factory=set)  # its sequences taken into a pass (in any order)

    @property
    def done(self) -> bool:
        return all(r is not None for r in self.results)

    @property
    def tokens(self) -> int:
        return sum(len(s.ids) for s in self.sequences)

    def output(self) -> str:
        """The job's answer (tasks/pooled.py), once done; or InvalidRequest if it asked for more dimensions than its
        vectors have."""
        pooled = self.job.spec.pooled
        assert pooled is not None
        values = [r for r in self.results if r is not None]
        if pooled.kind == "rerank":
            return scores_output([float(1 / (1 + np.exp(-float(v)))) for v in values])
        if pooled.dimensions is not None:
            size = len(values[0])
            if pooled.dimensions > size:
                raise InvalidRequest(
                    f"dimensions is {pooled.dimensions}; the model {self.pooler.name} makes vectors of {size}",
                    param="dimensions",
                )
            values = [_normalized(v[: pooled.dimensions]) for v in values]
        return embeddings_output([np.asarray(v, dtype="<f4").tobytes() for v in values])


class SideWork:
    """The pooled jobs claimed and not yet answered, read a pass at a time between the batch's steps, first come
    first read (a pass takes sequences of one model: the first waiting one's)."""

    def __init__(self) -> None:
        self.runs: dict[str, PooledRun] = {}

    def __bool__(self) -> bool:
        return bool(self.runs)

    def add(self, job: Job, pooler: Pooler) -> PooledRun:
        """Take a claimed job (InvalidRequest if its inputs cannot be read by its model)."""
        assert job.spec.pooled is not None
        sequences = pooler.sequences(job.spec.pooled)
        run = PooledRun(job, pooler, sequences, [None] * len(sequences))
        self.runs[job.id] = run
        return run

    def drop(self, job_id: str) -> PooledRun | None:
        return self.runs.pop(job_id, None)

    def step(self) -> tuple[list[PooledRun], list[PooledRun]]:
        """Read one pass: the runs it completed, and the runs whose pass failed (both taken out).

        A pass holds the oldest run's next sequence, and beside it the waiting sequences of that model whose lengths
        are nearest its own, while the pass holds PASS_TOKENS and pads at most a quarter of them: padding is work for
        nothing (on a CPU a pass costs its padded tokens); the oldest job advances every pass, so none waits behind
        newer ones for long."""
        first = next(iter(self.runs.values()))
        waiting = [
            (len(run.sequences[n].ids), order, run, n)
            for order, run in enumerate(r for r in self.runs.values() if r.pooler is first.pooler)
            for n in range(run.next, len(run.sequences))
            if n not in run.taken
        ]
        anchor = waiting[0]
        nearest = sorted(waiting[1:], key=lambda w: (abs(w[0] - anchor[0]), w[1], w[3]))
        chosen, width, real = [anchor], anchor[0], anchor[0]
        for candidate in nearest:
            padded = (len(chosen) + 1) * max(width, candidate[0])
            if padded > PASS_TOKENS or padded > PADDING_MOST * (real + candidate[0]):
                continue  # (a shorter one, farther, may still fit)
            chosen.append(candidate)
            width, real = max(width, candidate[0]), real + candidate[0]
        taken = [(run, n) for _, _, run, n in chosen]
        for run, n in taken:
            run.taken.add(n)
            while run.next in run.taken:
                run.next += 1
        try:
            values = first.pooler.forward([run.sequences[n] for run, n in taken])
        except Exception:  # its own runs fail; the batch and the other pooled jobs go on
            logger.exception("a pass of model %s failed, reading %d sequence(s)", first.pooler.name, len(taken))
            failed = list({id(run): run for run, _ in taken}.values())
            for run in failed:
                del self.runs[run.job.id]
            return [], failed
        for (run, n), value in zip(taken, values):
            run.results[n] = value
        done = [r for r in self.runs.values() if r.done]
        for run in done:
            del self.runs[run.job.id]
        return done, []


def _normalized(v: np.ndarray) -> np.ndarray:
    return v / max(float(np.linalg.norm(v)), 1e-12)
