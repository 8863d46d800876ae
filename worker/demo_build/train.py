"""Train the shipped demo model (worker/demo/): a small llama that writes English words, trained offline.

It learns the prose of Python's help pages (worker/demo_build/corpus.py) with a BPE tokenizer of its own, as plain
text and as ChatML conversations (a user says a sentence or a heading, the assistant goes on), so both raw and
chat prompts get words back. `onelane make-demo-model worker/demo --train` remakes it (about 8 minutes on two
shared cores with OpenBLAS); the seed is fixed, so it comes out the same up to floating-point rounding.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, cast

from worker.demo_build import corpus as demo_corpus
from worker.demo_build.model import llama_config, save, train_tokenizer

if TYPE_CHECKING:  # (the functions below import them when called: slow imports)
    import mlx.nn as nn
    import mlx.optimizers as optim
    import numpy as np
    from transformers import PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

#: ~3.7 M parameters (0.5 M of them the tied embeddings of 2,048 tokens): about 7.5 MB in bfloat16.
ARCHITECTURE = {"hidden_size": 256, "num_hidden_layers": 4, "intermediate_size": 704, "num_attention_heads": 4}
VOCAB_SIZE = 2048
SEQ_LEN = 128
BATCH = 8


Document = str | list[dict[str, str]]  # plain text, or a conversation (a user turn and the assistant's answer)


@dataclass(frozen=True)
class TrainReport:
    """What a training run did, for the log and the README."""

    parameters: int
    tokens: int  # in the training stream
    steps: int
    loss: float  # the mean over the last 50 steps
    seconds: float
    bytes_on_disk: int


def documents(seed: int) -> list[Document]:
    """The training documents, shuffled: every paragraph as plain text, and as the answer to a chat turn."""
    rng = random.Random(seed)
    docs: list[Document] = []
    for section in demo_corpus.sections():
        docs.append(_chat(section.title, section.paragraphs[0]))
        for paragraph, following in zip(section.paragraphs, [*section.paragraphs[1:], ""]):
            docs.append(paragraph + "\n\n")
            first, *rest = demo_corpus.sentences(paragraph)
            if rest:  # answered with the rest of the paragraph and the next one, as one: long answers that end
                docs.append(_chat(first, " ".join([*rest, following]).strip()))
    rng.shuffle(docs)
    return docs


def _chat(user: str, assistant: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


def token_stream(tokenizer: PreTrainedTokenizerFast, docs: list[Document]) -> tuple[list[int], list[bool]]:
    """The documents as one stream of tokens, and which of them the model learns to write: all of plain text, and
    of a conversation its answer only (the prompt, exactly as the served chat template renders it, is given)."""
    tokens: list[int] = []
    learnt: list[bool] = []
    for doc in docs:
        if isinstance(doc, str):
            parts = [(doc, True)]
        else:
            prompt = cast(str, tokenizer.apply_chat_template(doc[:1], add_generation_prompt=True, tokenize=False))
            parts = [(prompt, False), (doc[1]["content"] + "<|im_end|>\n", True)]
        for text, learn in parts:
            ids = tokenizer.encode(text, add_special_tokens=False)
            tokens.extend(ids)
            learnt.extend([learn] * len(ids))
    return tokens, learnt


def _optimizer(steps: int, learning_rate: float) -> optim.AdamW:
    """AdamW with a linear warm-up over a tenth of the steps, then a cosine decay."""
    import mlx.optimizers as optim

    warmup = max(1, steps // 10)
    schedule = optim.join_schedules(
        [optim.linear_schedule(1e-5, learning_rate, warmup), optim.cosine_decay(learning_rate, steps - warmup, 1e-4)],
        [warmup],
    )
    return optim.AdamW(learning_rate=schedule, weight_decay=0.1)


def train_demo_model(
    path: Path,
    steps: int = 800,
    batch: int = BATCH,
    seed: int = 0,
    learning_rate: float = 3e-3,
    compiled: bool = True,
) -> TrainReport:
    """Train the demo model for `steps` batches of `batch` sequences and write it to `path` in bfloat16. `compiled`:
    the training step compiled (MLX's CPU build compiles it with a C++ compiler: half a minute here, which a run
    of a few steps does not win back)."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    started = time.perf_counter()
    docs = documents(seed)
    tokenizer = train_tokenizer([d for d in docs if isinstance(d, str)], vocab_size=VOCAB_SIZE)
    tokens, learnt = token_stream(tokenizer, docs)
    data, weights = np.array(tokens, dtype=np.int32), np.array(learnt, dtype=np.float32)
    config = llama_config(ARCHITECTURE, tokenizer)
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    # (a list: mlx types tree_flatten's result as a list or a dict)
    flat = cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))
    parameters = sum(p.size for _, p in flat)
    logger.info("training %.2f M parameters on %d tokens for %d steps", parameters / 1e6, len(data), steps)
    fit = Training(steps=steps, batch=batch, seed=seed, learning_rate=learning_rate, compiled=compiled, started=started)
    losses = _fit(model, data, weights, fit)
    model.set_dtype(mx.bfloat16)
    save(path, model, tokenizer, {**config, "torch_dtype": "bfloat16"})
    size = sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())
    report = TrainReport(
        parameters, len(data), steps, sum(losses[-50:]) / len(losses[-50:]), time.perf_counter() - started, size
    )
    logger.info("demo model written to %s: %s", path, report)
    return report


@dataclass(frozen=True, kw_only=True)
class Training:
    """How the model is trained: steps of `batch` windows drawn with `seed`, at `learning_rate`."""

    steps: int
    batch: int
    seed: int
    learning_rate: float
    compiled: bool
    started: float  # (perf_counter: the training's start, for its log)


def _fit(model: nn.Module, data: np.ndarray, weights: np.ndarray, fit: Training) -> list[float]:
    """Train `model` on windows of the token stream `data`, each token's loss weighted by `weights`; the losses."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    import numpy as np

    def loss_fn(model: nn.Module, x: mx.array, y: mx.array, w: mx.array) -> mx.array:
        return (nn.losses.cross_entropy(model(x), y) * w).sum() / w.sum()

    loss_and_grad = nn.value_and_grad(model, loss_fn)
    optimizer = _optimizer(fit.steps, fit.learning_rate)
    state = [model.state, optimizer.state]

    def update(x: mx.array, y: mx.array, w: mx.array) -> mx.array:
        loss, grads = loss_and_grad(model, x, y, w)
        optimizer.update(model, optim.clip_grad_norm(grads, 1.0)[0])
        return loss  # type: ignore[no-any-return]  # (nn.value_and_grad's function is untyped)

    step = partial(mx.compile, inputs=state, outputs=state)(update) if fit.compiled else update
    rng = np.random.default_rng(fit.seed)
    losses: list[float] = []
    for n in range(1, fit.steps + 1):
        windows = [slice(s, s + SEQ_LEN + 1) for s in rng.integers(0, len(data) - SEQ_LEN - 1, fit.batch)]
        sequences = mx.array(np.stack([data[w] for w in windows]))
        loss = step(sequences[:, :-1], sequences[:, 1:], mx.array(np.stack([weights[w][1:] for w in windows])))
        mx.eval(state, loss)
        losses.append(loss.item())  # type: ignore[arg-type]  # (item() of a float32 scalar: a float)
        if n % 100 == 0 or n == fit.steps:
            mean, took = sum(losses[-50:]) / len(losses[-50:]), time.perf_counter() - fit.started
            logger.info("step %d/%d: loss %.3f (%.0f s)", n, fit.steps, mean, took)
    return losses
