"""What a job's prompt may hold: the model's context (its config's `max_position_embeddings`, which a GGUF's
`context_length` becomes as it is imported) and the server's KV budget (ONELANE_KV_BUDGET).

A prompt fits when it leaves room for at least one token of answer in the context, and its tokens alone are within
the budget; one that does not is refused (ContextLengthExceeded) before it runs: at admission, where the web counts
it (tasks/token_count.py), and as it joins the batch, where the worker does (worker/runner/joining.py). An answer may
not run past the context: a `max_tokens` beyond what the prompt leaves of it is clipped to that, not refused (as
mlx_lm.server and Ollama refuse none), so that a client that asks for 32,000 tokens by default (Claude Code) is
served by a model of 8,192. (A job whose prompt and answer pass a budget smaller than the context still runs alone, as before.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tasks.errors import ContextLengthExceeded
from tasks.settings import Settings

#: where a model's config says how many positions it reads (a vision-language model's language model's, in
#: `text_config`)
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")

_known: dict[str, int] = {}  # a folder's context, once read (a GGUF model's folder appears when first imported)


def context_of(folder: str) -> int | None:
    """The context of the model in `folder`, from its config.json; None if it says none (or is not there yet)."""
    if (known := _known.get(folder)) is not None:
        return known
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    found = _positions(config) if isinstance(config, dict) else None
    if found is not None:
        _known[folder] = found
    return found


def _positions(config: dict[str, object]) -> int | None:
    for part in (config, config.get("text_config")):
        if not isinstance(part, dict):
            continue
        for key in CONTEXT_KEYS:
            value = part.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


@dataclass(frozen=True)
class Window:
    """What one job's prompt and answer may hold on its model: `context` (None: unknown) and the KV `budget`."""

    context: int | None
    budget: int

    def check(self, prompt_tokens: int, param: str | None = None) -> None:
        """ContextLengthExceeded if a prompt of `prompt_tokens` does not fit (see the module's docstring)."""
        past_context = self.context is not None and prompt_tokens >= self.context
        if past_context or prompt_tokens > self.budget:
            raise ContextLengthExceeded(prompt_tokens, self.context, self.budget, param=param)

    def answer(self, prompt_tokens: int, max_tokens: int) -> int:
        """The tokens a prompt of `prompt_tokens` may be answered with, asking for `max_tokens`: no further than the
        context."""
        if self.context is None:
            return max_tokens
        return max(min(max_tokens, self.context - prompt_tokens), 1)


def window_of(settings: Settings, model: str) -> Window:
    """What a job of `model` may hold on this server (its context unknown if its folder does not say yet)."""
    config = settings.model_named(model)
    return Window(context_of(config.path) if config is not None else None, settings.kv_budget_tokens)
