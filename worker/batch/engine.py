"""The model, loaded once per process, and the one continuous batch every job goes through.

worker/batch/forward.py does the batching: each `step()` advances every generating sequence by one token in one forward
pass, and prefills joining prompts in bounded chunks alongside. A batch of one is the serial case: with `max_batch=1`
a sequence joins only when the previous one has left. Sequences join and leave at any step.

Per sequence, independent of what else shares the batch: its sampler (temperature, top_p, and a random key of its
own when it has a seed: the global random state is never used for a seeded job), its max_tokens and its stop
tokens (none for ignore_eos: the shared tokenizer is never changed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache
from mlx_lm.tokenizer_utils import TokenizerWrapper

from tasks.catalogue import DEMO_MODEL, ModelConfig
from tasks.chat_prompt import chat_input
from tasks.context import context_of
from tasks.errors import InvalidPrompt
from tasks.job import JobSpec, SamplingParams
from tasks.settings import PREFILL_BATCH
from worker.batch.drafting import Drafter, load_drafter
from worker.batch.dtypes import with_dtype
from worker.batch.forward import ContinuousBatch
from worker.batch.logits import Draw
from worker.batch.logprobs import Logprobs
from worker.batch.positions import Positions
from worker.batch.rows import Batching, Counters, Embeds, unchecked, unmergeable
from worker.batch.sampling import Sampler, Scorer, make_sampler
from worker.batch.speculation import OFF, Speculation, dropped_heads
from worker.grammar import GrammarMatcher, Grammars
from worker.token_bytes import TokenBytes

logger = logging.getLogger(__name__)

#: a prompt's images' bytes by digest, or what reads them when they are needed (None: none)
Images = Mapping[str, bytes] | Callable[[], Mapping[str, bytes]] | None


@dataclass(frozen=True, kw_only=True)
class KV:
    """A sequence's KV cache, taken out of the batch, and the tokens it holds (its prompt and what it generated)."""

    cache: list[Any]
    tokens: list[int]


@dataclass(frozen=True, kw_only=True)
class Token:
    """One sequence's step: the token generated, and why it ended if this was its last (then, its KV state)."""

    uid: int
    token: int
    finish_reason: str | None  # "stop" (EOS), "length" (max_tokens) or None
    kv: KV | None = None
    logprob: str | None = None  # its log probability's entry (tasks/logprobs.py), if its sequence asked for them
    proposed: int = 0  # (a step's first token of a sequence that proposed) its proposals (worker/batch/speculation.py)
    accepted: int = 0  # ... and those kept


class Engine:
    """Owns the model and its one batch. Only the thread holding `lock` may drive it: MLX on Metal aborts the
    process when two threads evaluate at once."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: TokenizerWrapper,
        name: str,
        max_batch: int = 1,
        prefill_step: int = 512,
        lock: threading.Lock | None = None,
        max_kv_size: int | None = None,
        drafter: Drafter | None = None,
    ) -> None:
        self.model = model
        self.drafter = drafter  # a draft model proposing its sequences' tokens (None: prompt lookup)
        self.dropped_heads = 0  # multi-token-prediction heads its checkpoint carries, dropped by mlx-lm as it loads
        self.tokenizer = tokenizer
        self.name = name
        self._max_batch = max_batch
        self.prefill_step = prefill_step
        self.decode_floor = 0.0  # tokens/s its decoding sequences keep while prompts are read (0: none; configure)
        self._speculation = OFF  # how its sequences propose tokens (none until configured)
        self.lock = lock or threading.Lock()  # the device's: every engine of a worker shares one
        self.max_kv_size = max_kv_size  # tokens of KV cache a sequence keeps (None: all of them)
        # tokens a sequence may hold, prompt and answer (tasks/context.py): its config's, when Engine.load reads it
        self.context: int | None = _context(model)
        self._done = Counters()  # the work of the batches before this one
        # how its sequences share the batch: `alone` if a cache cannot be merged or its batched form checked, else as
        # worker/batch/sharing.py finds (rows.py: unmergeable, unchecked)
        self.batching: Batching = "alone" if unmergeable(model) or unchecked(model) else "padded"
        self.kv_bytes_per_token, self.vocab = _measure(model)
        self.token_bytes = TokenBytes(tokenizer)
        self.eos = frozenset(tokenizer.eos_token_ids)
        self.grammars = Grammars(tokenizer, self.eos)
        self._batch = self._new_batch()
        self._uids: set[int] = set()  # the uids of the sequences in the batch
        self._logprobs = Logprobs(self.token_bytes, self.eos)  # what its sequences draw, for those that record it

    @classmethod
    def load(
        cls, model: str | ModelConfig, max_batch: int = 1, prefill_step: int = 512, lock: threading.Lock | None = None
    ) -> Engine:
        """Load a local folder or a Hugging Face id with mlx_lm.load, with a served model's load options."""
        config = model if isinstance(model, ModelConfig) else ModelConfig(name=DEMO_MODEL, path=model)
        started = time.perf_counter()
        loaded, tokenizer = load(config.path, **config.load_options())[:2]
        dtype = with_dtype(loaded, config.dtype)
        drafter = load_drafter(config.draft, config.dtype, config.name, tokenizer) if config.draft else None
        logger.info(
            "model %s loaded from %s in %.2f s (%s%s)",
            config.name,
            config.path,
            time.perf_counter() - started,
            dtype,
            f"; draft model {drafter.name}" if drafter is not None else "",
        )
        engine = cls(loaded, tokenizer, config.name, max_batch, prefill_step, lock, config.max_kv_size, drafter)
        engine.context = context_of(config.path) or engine.context
        engine.dropped_heads = dropped_heads(config.path)
        return engine

    @property
    def max_batch(self) -> int:
        """Sequences at once: the configured batch, or one for a model whose sequences run alone."""
        return 1 if self.batching == "alone" else self._max_batch

    def configure(
        self, max_batch: int, prefill_step: int, decode_floor: float = 0.0, speculation: Speculation = OFF
    ) -> None:
        """Size the batch, the floor of tokens per second its decoding sequences keep while prompts are read, and
        its speculation: the most tokens a sequence proposes a step, and a step reads over all (0: none;
        worker/batch/speculation.py). It starts afresh: call it while nothing runs."""
        self._max_batch, self.prefill_step, self.decode_floor = max_batch, prefill_step, decode_floor
        self._speculation = speculation
        self.reset()

    def share(self, batching: Batching) -> None:
        """Say how its sequences share the batch (it starts afresh: call it while nothing runs)."""
        self.batching = batching
        self.reset()

    def _new_batch(self) -> ContinuousBatch:
        return ContinuousBatch(
            self.model,
            self.prefill_step,
            min(self.max_batch, PREFILL_BATCH),
            self.max_kv_size,
            self.batching,
            decode_floor=self.decode_floor,
            speculation=self._speculation,
            proposer=self.drafter,
        )

    def prompt_tokens(
        self,
        spec: JobSpec,
        images: Images = None,
        *,
        wait: bool = True,
        reach: Callable[[list[int]], int] | None = None,
    ) -> list[int]:
        """The prompt as the model reads it; InvalidPrompt if that is no token at all. (`images`: the bytes of the
        images its messages hold, by digest, or what reads them when needed (from Redis: off the device thread), for a
        model that reads them, which prepares them away from the device
        thread, raising `Preparing` while it does unless `wait`; `reach`: how much of a prompt the prefix cache
        holds: worker/vision.py.)"""
        if any(m.images for m in spec.messages or ()):  # (admitted under an older models file: the web checks it)
            raise InvalidPrompt(f"the model {self.name} reads text only: it cannot read the images in this request")
        if spec.messages is not None:
            messages, tools = chat_input(spec.messages, spec.tools, self.tokenizer)
            extra = {"tools": tools} if tools else {}
            tokens = list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, **extra))
        else:
            tokens = list(self.tokenizer.encode(spec.prompt or ""))
        if not tokens:
            raise InvalidPrompt("the prompt is empty once tokenized: there is nothing to continue")
        return tokens

    def detokenizer(self) -> Any:  # (mlx-lm's streaming detokenizers share no typed base)
        """A streaming detokenizer of its own for one sequence."""
        return self.tokenizer.detokenizer

    def insert(
        self,
        prompt: list[int],
        params: SamplingParams,
        cache: list[Any] | None = None,
        cached: int = 0,
        generated: tuple[int, ...] = (),
        constraint: GrammarMatcher | None = None,
    ) -> int:
        """Add a sequence to the batch; it prefills over the next steps, then generates. Returns its uid. With
        `cache`, a KV cache holding the first `cached` tokens, only the rest is prefilled. `generated`: tokens an
        earlier run of the job sampled, read as prompt after `prompt`; it goes on from there, with the rest of its
        max_tokens and its sampler where that run's was. `constraint`: its grammar's matcher, which masks its logits
        (after the penalties and biases its params ask for, so a token the grammar forbids stays forbidden)."""
        sampler: Sampler = make_sampler(params, len(generated))
        if params.penalized or params.logprobs:
            sampler = Draw(params, sampler, generated, self.vocab, self._logprobs.fresh if params.logprobs else None)
        prompt = [*prompt, *generated]
        embeds, ids = self.embeddings(prompt, cached if cache is not None else 0)
        uid = self._batch.insert(
            prompt[cached:],
            params.max_tokens - len(generated),
            sampler,
            [constraint] if constraint is not None else [],
            frozenset() if params.ignore_eos else self.eos,
            cache,
            prompt[:cached] if cache is not None else None,
            embeds,
            ids,
            alone=self.runs_alone(prompt),
            positions=self.positions(prompt),
        )
        self._uids.add(int(uid))
        if isinstance(sampler, Draw) and params.logprobs:
            self._logprobs.follow(int(uid), sampler)
        return int(uid)

    def marks(self, tokens: list[int]) -> tuple[tuple[int, str], ...]:
        """The full digests of the images of a prompt (where each starts), which cached state must match: none in
        a text model's (worker/vision.py)."""
        return ()

    @property
    def speculation(self) -> str:
        """How its sequences speculate: `prompt lookup`, `draft model NAME`, or `off` and why
        (worker/batch/speculation.py)."""
        why = self._batch.refusal
        if why is None:
            said = f"draft model {self.drafter.name}" if self.drafter is not None else "prompt lookup"
        else:
            said = why if why == "off" else f"off: {why}"
        if self.dropped_heads:
            said += f"; its {self.dropped_heads} multi-token-prediction head(s) unused: mlx-lm drops them as it loads"
        return said

    @property
    def images(self) -> str | None:
        """How its image prompts run (worker/vision.py); None: it reads no images."""
        return None

    def runs_alone(self, prompt: list[int]) -> bool:
        """Whether this prompt's sequence must run with nothing beside it in the batch (an image prompt of a model
        whose images come with inputs to every step, worker/vision.py); a text model's never does."""
        return False

    def embeddings(self, prompt: list[int], cached: int) -> tuple[Embeds | None, list[int] | None]:
        """For a prompt with images still to read (after its first `cached` tokens): the input embeddings of the rest
        but its last token, and their ids as the model knows them (worker/vision.py); a text model reads ids."""
        return None, None

    def positions(self, prompt: list[int]) -> Positions | None:
        """A sequence's own positions, where the model's depend on its images (worker/batch/positions.py: a
        vision model's, worker/vision.py); None for a text model's, whose positions are its tokens' indices."""
        return None

    def extract(self, uid: int, keep: int) -> list[Any] | None:
        """A copy of a sequence's KV cache, cut to its first `keep` tokens (the sequence stays in the batch); None if
        it holds fewer, or its cache cannot be cut."""
        found = self._batch.extract(uid)
        if found is None or len(found[1]) < keep:
            return None
        cache, tokens = found
        cut = len(tokens) - keep
        if cut and cast(int, trim_prompt_cache(cache, cut)) != cut:  # (it returns the count: typed List[Any])
            return None
        return cache

    def scorer(self, prompt: list[int], top: int) -> Scorer:
        """A reading of `prompt` outside the batch that records each token's log probability (see Scorer)."""
        return Scorer(self, prompt, top)

    def remove(self, uids: list[int], keep: bool = False) -> dict[int, KV]:
        """Take sequences out of the batch before the next step (cancelled, stopped, over time); with `keep`, their
        KV states. A uid no longer in the batch is passed over."""
        uids = [uid for uid in uids if uid in self._uids]
        if not uids:
            return {}
        kept = self._batch.remove(uids, keep=keep)
        for uid in uids:
            self._uids.discard(uid)
            self._logprobs.forget(uid)
        return {int(uid): KV(cache=cache, tokens=list(tokens)) for uid, (cache, tokens) in kept.items()}

    @property
    def counters(self) -> Counters:
        """The engine's work so far (any thread may read it: the generator's counters only grow)."""
        return self._done + self._live()

    def _live(self) -> Counters:
        return dataclasses.replace(self._batch.work)  # (a copy: the batch counts on)

    @property
    def padded_prefill(self) -> int:
        """Prompt tokens the last step read, padded to its longest chunk (as the device paid for them: the
        worker's pace)."""
        return self._batch.padded_prefill

    def step(self) -> list[Token]:
        """One step: a token for every generating sequence, and a chunk of prefill for joining ones."""
        generated = self._batch.step()
        self._logprobs.record()
        entries = self._logprobs.step_entries(generated)
        tokens = [
            Token(
                uid=r.uid,
                token=r.token,
                finish_reason=r.finish_reason,
                kv=KV(cache=r.cache, tokens=list(r.tokens)) if r.cache is not None and r.tokens is not None else None,
                logprob=entries.get(r.uid),
                proposed=r.proposed,
                accepted=r.accepted,
            )
            for r in generated
        ]
        for t in tokens:
            if t.finish_reason is not None:  # the generator dropped them
                self._uids.discard(t.uid)
                self._logprobs.forget(t.uid)
        return tokens

    def entries(self, rows: mx.array, tokens: list[int], top: int) -> list[str]:
        """For each row of log probabilities (a prompt's, read outside the batch), its token's entry."""
        return self._logprobs.entries(rows, tokens, top)

    @property
    def size(self) -> int:
        """Sequences in the batch."""
        return len(self._uids)

    def close(self) -> None:
        """Let go of the batch (the model is about to be evicted)."""
        with contextlib.suppress(Exception):
            self._batch.close()

    def reset(self) -> None:
        """Drop every sequence (after a step failed, the batch's state cannot be trusted)."""
        self._done = self.counters
        with contextlib.suppress(Exception):
            self._batch.close()
        self._batch = self._new_batch()
        self._uids.clear()
        self._logprobs.clear()


def _measure(model: nn.Module) -> tuple[int, int]:
    """Bytes of KV cache one token takes, and the size of the vocabulary the model scores, measured on a short
    forward pass: what the caches hold for those tokens (a KV cache allocates ahead in steps of 256 tokens; that
    room is not counted), divided by their number; the width of its logits."""
    n = 8
    cache = make_prompt_cache(model)
    vocab = int(model(mx.array([list(range(n))]), cache=cache).shape[-1])
    held = 0
    for c in cache:
        keys, values = getattr(c, "keys", None), getattr(c, "values", None)
        if isinstance(keys, mx.array) and isinstance(values, mx.array):  # [batch, heads, room, dim]: n of the room
            held += (keys.nbytes + values.nbytes) * n // keys.shape[2]
    return max(held // n, 1), vocab


def _context(model: nn.Module) -> int | None:
    """The positions the model reads, as its arguments say (mlx-lm's models keep their config's)."""
    args = getattr(model, "args", None)
    value = getattr(args, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None
