"""A prompt's tokens, counted at admission: by token counter processes (tasks/token_child.py, run as
tasks/children.py runs its children) with the model's own tokenizer and chat template, so that a prompt that does
not fit its model is refused before it waits (tasks/context.py), and its ETA and fair charge read its real length.

The web only waits on a socket meanwhile: other requests and streams go on. A count that cannot be had in time (every
counter busy for WAIT_S, one taking past COUNT_S, a model whose folder is not there yet: a GGUF not imported yet, a
Hugging Face id) is None: the job is admitted on its characters, as before, and the worker counts it as it joins,
refusing it then if it does not fit. A prompt with images is left to the worker (the processor makes their tokens),
and so is every prompt of a vision-language model: mlx-vlm renders it with the processor's template where the
processor has one (InternVL's is in mlx-vlm's code) and tokenizes it by its own rule (worker/vision.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tasks.catalogue import ModelConfig
from tasks.children import ChildKind, Children, Crashed, Overran
from tasks.errors import Overloaded
from tasks.job import JobSpec
from tasks.settings import Settings

logger = logging.getLogger(__name__)

COUNT_S = 5.0  # one count, at most (a tokenizer's first load in its process included: a count itself takes ms)
WAIT_S = 1.0  # waiting for a free counter, at most
RETRY_S = 300.0  # a model whose tokenizer the counter could not load is not asked of again for this long
COUNTERS = 2  # processes per web process, each counting one prompt at a time
COUNTER = ChildKind(module="tasks.token_child", name="token counter", size=COUNTERS, answer_s=COUNT_S, wait_s=WAIT_S)


class TokenCounts:
    """The token counters of this process."""

    def __init__(self, counters: int = COUNTERS) -> None:
        self.children = Children(replace(COUNTER, size=counters))
        self._failed: dict[str, float] = {}  # models whose tokenizer the counter could not load, and when

    def count(self, settings: Settings, spec: JobSpec) -> int | None:
        """The tokens of `spec`'s prompt as its model reads them; None when they cannot be counted here in time."""
        config = settings.model_named(spec.model)
        if config is None or spec.side or config.vision or not _ready(config):
            return None
        if time.monotonic() - self._failed.get(spec.model, -RETRY_S) < RETRY_S:
            return None
        try:
            answer, _ = self.children.ask(_header(config), spec.model_dump_json().encode())
        except (Overloaded, Overran, Crashed) as exc:
            logger.warning("a prompt of model %s was not counted at admission: %s", spec.model, exc)
            return None
        if "error" in answer and not answer.get("tokenizer"):  # (not asked again for RETRY_S: the worker counts)
            self._failed[spec.model] = time.monotonic()
            logger.warning("the prompts of model %s cannot be counted at admission: %s", spec.model, answer["error"])
        if "error" in answer:
            return None
        return int(answer["tokens"])

    def warm(self, settings: Settings) -> None:
        """Start a counter now, in the background, with the default model's tokenizer loaded: the first request
        does not wait for it."""
        config = settings.model_named(settings.model_name)
        if config is not None and config.kind == "generate" and _ready(config):
            self.children.warm(_header(config))

    def close(self) -> None:
        self.children.close()


def _ready(config: ModelConfig) -> bool:
    """Whether the model's folder holds a tokenizer to count with (a GGUF's, once the worker imported it)."""
    folder = Path(config.path)
    return (folder / "config.json").is_file() and any(
        (folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    )


def _header(config: ModelConfig) -> dict[str, Any]:
    options: dict[str, Any] = {**config.tokenizer_config, "trust_remote_code": config.trust_remote_code}
    if config.revision is not None:
        options["revision"] = config.revision
    return {"folder": config.path, "options": options}


COUNTS = TokenCounts()
