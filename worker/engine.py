"""The model, loaded once per process, and the one generator every job goes through."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

from tasks.errors import InvalidPrompt
from tasks.job import JobSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Chunk:
    """One generation step: new text, tokens generated so far, and the finish reason on the last step."""

    text: str
    tokens: int
    prompt_tokens: int
    finish_reason: str | None = None


class Engine:
    """Owns the model. A lock makes sure one process never runs two generations at once, even if a
    misconfiguration gave it more threads: MLX on Metal aborts the process when that happens."""

    def __init__(self, model, tokenizer, name: str) -> None:  # type: ignore[no-untyped-def]
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str) -> Engine:
        """Load a local folder or a Hugging Face id with mlx_lm.load."""
        started = time.perf_counter()
        model, tokenizer = load(path)
        logger.info("model %s loaded in %.2f s", path, time.perf_counter() - started)
        return cls(model, tokenizer, path)

    def prompt_tokens(self, spec: JobSpec) -> list[int]:
        """The prompt as the model reads it; InvalidPrompt if that is no token at all."""
        if spec.messages is not None:
            messages = [m.model_dump() for m in spec.messages]
            tokens = list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        else:
            tokens = list(self.tokenizer.encode(spec.prompt or ""))
        if not tokens:
            raise InvalidPrompt("the prompt is empty once tokenized: there is nothing to continue")
        return tokens

    def generate(self, spec: JobSpec) -> Iterator[Chunk]:
        """Yield one Chunk per generated token. Closing the generator stops generation."""
        params = spec.params
        with self._lock:
            prompt = self.prompt_tokens(spec)
            if params.seed is not None:
                mx.random.seed(params.seed)
            sampler = make_sampler(temp=params.temperature, top_p=params.top_p)
            with self._eos_ignored(params.ignore_eos):
                for response in stream_generate(
                    self.model, self.tokenizer, prompt, max_tokens=params.max_tokens, sampler=sampler
                ):
                    yield Chunk(response.text, response.generation_tokens, len(prompt), response.finish_reason)

    @contextlib.contextmanager
    def _eos_ignored(self, ignore: bool) -> Iterator[None]:
        """Generate to max_tokens past EOS (as vLLM's ignore_eos); safe because the lock is held."""
        if not ignore:
            yield
            return
        saved = set(self.tokenizer.eos_token_ids)
        self.tokenizer.eos_token_ids = set()
        try:
            yield
        finally:
            self.tokenizer.eos_token_ids = saved
