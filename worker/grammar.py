"""Grammar-constrained decoding: a job whose answer must follow a grammar (a JSON schema, JSON, tool calls) has a
matcher of its own, which masks the tokens that would break the grammar before its sampler draws.

The grammar is llguidance's (built and checked at admission: tasks/structured.py); llguidance compiles it against
the model's tokenizer. Per model, a `Grammars` keeps the tokenizer llguidance reads and the matchers compiled so far,
by the grammar's digest: a batch of 10,000 lines with one schema compiles it once, and each job gets a copy.

The mask is applied by MLX ops (`mx.where`), not llguidance's Metal kernel, so it runs on MLX's CPU, CUDA and Metal
builds alike. It is a logits processor of its sequence only (mlx-lm's BatchGenerator takes them per sequence): an
unconstrained sequence in the same batch is never masked.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import llguidance
import llguidance.hf
import mlx.core as mx
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

logger = logging.getLogger(__name__)

COMPILED_KEPT = 64  # compiled grammars kept per model


class GrammarError(Exception):
    """A grammar the model's tokenizer cannot compile (admission checked it without a tokenizer)."""


@dataclass
class MaskTimes:
    """What constraining cost this worker: masks computed and applied, their seconds, and compiles."""

    masks: int = 0
    mask_s: float = 0.0
    compiles: int = 0
    compile_s: float = 0.0
    cached: int = 0  # grammars served from the compiled cache


class Grammars:
    """One model's grammars: the tokenizer llguidance reads, built once, and its compiled matchers by digest."""

    def __init__(self, tokenizer: TokenizerWrapper, eos: frozenset[int]) -> None:
        self._hf = tokenizer._tokenizer  # mlx-lm's TokenizerWrapper wraps a Hugging Face fast tokenizer
        self._eos = sorted(eos)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._unreadable = ""  # why llguidance could not read the tokenizer, once it failed
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self.times = MaskTimes()

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's reading of the model's tokenizer; GrammarError if it cannot read it (it panics, a
        BaseException, on a token over 1,024 bytes: caught here, or it would end the worker's thread)."""
        if self._tokenizer is None:
            if self._unreadable:
                raise GrammarError(self._unreadable)
            try:
                self._tokenizer = llguidance.hf.from_tokenizer(self._hf, eos_token=self._eos)
            except (KeyboardInterrupt, SystemExit, GeneratorExit):
                raise
            except BaseException as exc:  # noqa: BLE001 (pyo3's PanicException derives from BaseException)
                logger.warning("llguidance cannot read this model's tokenizer: %s", exc)
                self._unreadable = "this model's tokenizer cannot be read by the grammar engine (llguidance)"
                raise GrammarError(self._unreadable) from None
        return self._tokenizer

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        """A fresh matcher of `grammar`, compiled once per model; GrammarError if it cannot be."""
        digest = hashlib.sha256(grammar.encode()).hexdigest()
        with self._lock:
            compiled = self._compiled.get(digest)
            if compiled is not None:
                self._compiled.move_to_end(digest)
                self.times.cached += 1
                return compiled.deep_copy()
        tokenizer = self.tokenizer  # (built once per model, ~0.5 s for 49k tokens: not a compile's time)
        started = time.perf_counter()
        compiled = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if compiled.is_error():
            raise GrammarError(compiled.get_error())
        with self._lock:
            self.times.compiles += 1
            self.times.compile_s += time.perf_counter() - started
            self._compiled[digest] = compiled
            while len(self._compiled) > COMPILED_KEPT:
                self._compiled.popitem(last=False)
        return compiled.deep_copy()

    def constrain(self, grammar: str, generated: tuple[int, ...] = ()) -> GrammarMatcher:
        """The logits processor of one sequence, its matcher past the tokens an earlier run `generated`."""
        matcher = self.matcher(grammar)
        if generated and not matcher.consume_tokens(list(generated)):
            raise GrammarError(f"an earlier run's tokens do not follow the grammar: {matcher.get_error()}")
        return GrammarMatcher(matcher, self.tokenizer.vocab_size, self.times)


class GrammarMatcher:
    """One sequence's matcher, as the logits processor mlx-lm calls before each of the sequence's samples.

    mlx-lm calls it with the tokens so far: at its first call the sequence has sampled nothing yet (its context ends
    with its prompt); at every later call, the token sampled last is the context's last one, and the matcher takes it
    before it masks the next. So when the runner reads a token, the matcher has taken it: `done` tells at once that
    the grammar is complete, and the sequence ends there.
    """

    def __init__(self, matcher: llguidance.LLMatcher, vocab: int, times: MaskTimes) -> None:
        self.matcher = matcher
        self.vocab = vocab
        self.times = times
        self._started = False
        self._bits = allocate_token_bitmask(1, vocab)

    def __call__(self, context: mx.array, logits: mx.array) -> mx.array:
        # the step's forward pass starts now, on the device, while the mask is computed here: it needs the token
        # drawn last, and so does the mask (else the device would wait for the mask, every step)
        mx.async_eval(logits)
        started = self._take_read(context)
        masked = mx.where(mx.array(self._allowed(logits.shape[-1])), logits, -mx.inf)
        self.times.masks += 1
        self.times.mask_s += time.perf_counter() - started
        return masked

    def _take_read(self, context: mx.array) -> float:
        """The token read now (the context's last) taken, unless the sequence has drawn nothing since its prompt
        or its fast-forward; returns when the mask's time starts."""
        if self._started:  # (reading the token waits for the step that drew it: not the mask's time)
            token = int(context[-1].item())  # type: ignore[arg-type]  # (item() of an integer array: never complex)
            started = time.perf_counter()
            self.matcher.consume_token(token)
        else:
            started = time.perf_counter()
        self._started = True
        return started

    def _allowed(self, width: int, matcher: llguidance.LLMatcher | None = None) -> np.ndarray:
        """The tokens the grammar (as `matcher` stands: by default this sequence's) allows next, as a row of `width`
        booleans (the model's rows past the tokenizer's vocabulary: never allowed)."""
        fill_next_token_bitmask(matcher or self.matcher, self._bits)
        allowed = np.zeros(width, dtype=np.bool_)
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: min(self.vocab, width)]
        allowed[: bits.shape[0]] = bits
        return allowed

    # --- speculation (worker/batch/speculation.py): a proposal is checked against the grammar ------------------

    def valid(self, read: int, proposal: list[int]) -> int:
        """How many of `proposal`'s first tokens the grammar allows after the token read now (`read`)."""
        if not proposal:
            return 0
        if self._started:
            return max(0, self.matcher.validate_tokens([read, *proposal]) - 1)
        return self.matcher.validate_tokens(proposal)

    def ahead(self, context: mx.array, logits: mx.array, proposal: list[int]) -> mx.array:
        """The logits of a step that reads `proposal` after the context's last token (one row a place), each place
        masked as the grammar stands after the proposals before it: a copy of the matcher takes them to compute its
        masks (the read token is taken, as in `__call__`); `keep` takes those the row keeps."""
        mx.async_eval(logits)
        started = self._take_read(context)
        width = logits.shape[-1]
        masks = [self._allowed(width)]
        # (on a copy, not the matcher rolled back: after a proposal that ran to the grammar's end, the rolled-back
        # matcher refused the very tokens it had taken)
        probe = self.matcher.deep_copy() if proposal else self.matcher
        for token in proposal:
            probe.consume_token(token)
            masks.append(self._allowed(width, probe))
        self.times.masks += len(masks)
        self.times.mask_s += time.perf_counter() - started
        return mx.where(mx.array(np.stack(masks)), logits, -mx.inf)

    def keep(self, tokens: list[int]) -> None:
        """The proposals the row kept: taken (its own draw after them is taken as the next step reads it)."""
        if tokens:
            self.matcher.consume_tokens(tokens)

    def forced(self, limit: int) -> list[int]:
        """The tokens the grammar forces next (a schema's fixed keys and punctuation), up to `limit`."""
        return self.matcher.compute_ff_tokens()[:limit] if limit > 0 else []

    def take(self, tokens: list[int]) -> None:
        """The sequence goes on past `tokens` (fast-forwarded: read as prompt, never sampled): the matcher takes them,
        and its next call masks the token after them."""
        self.matcher.consume_tokens(tokens)
        self._started = False

    @property
    def done(self) -> bool:
        """The grammar is complete: nothing may follow but the end."""
        return self.matcher.is_stopped() and not self.matcher.is_error()

    @property
    def error(self) -> str | None:
        """Why the matcher could not go on (never, unless the mask was not applied)."""
        return self.matcher.get_error() if self.matcher.is_error() else None
