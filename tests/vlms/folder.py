"""What every tiny vision folder of the corpus is written with (tests/vlms/): the mlx-vlm class's own initialisation
under a fixed seed in float32, its 4-D (convolution) weights in torch's layout as the hub stores them, the keys the
family's hub checkpoint has, and the demo tokenizer with the family's special tokens added after its vocabulary (the
text model's vocab_size the tokenizer's length), as tests/tiny_vision.py writes Gemma 3 and SmolVLM."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.tiny_kinds import parameters, save_weights, seeded, write_json
from tests.tiny_vision import (
    DEMO_IDS,
    DEMO_VOCAB,
    END,
    START,
    _torch_conv,
    _write_generation_config,
    _write_tokenizer,
)

__all__ = ["DEMO_IDS", "DEMO_VOCAB", "END", "START", "Family", "Unbuildable", "added_ids", "write_folder"]


class Unbuildable(Exception):
    """An architecture whose tiny folder cannot be made (its message says why): mlx-vlm's, not onelane's."""


def added_ids(tokens: list[str]) -> dict[str, int]:
    """The ids the demo tokenizer gives `tokens` added after its vocabulary, in order."""
    return {token: DEMO_VOCAB + i for i, token in enumerate(tokens)}


@dataclass(frozen=True, kw_only=True)
class Family:
    """One architecture's folder: its mlx-vlm module, config.json, the tokens its processor needs, its chat template,
    the processor's files, and how the hub names its weights."""

    module: str  # mlx_vlm.models.<module>
    config: dict[str, Any]
    tokens: list[str]
    template: str
    eos: int | list[int]
    tokenizer: dict[str, Any] = field(default_factory=dict)  # over tokenizer_config.json (named tokens, eos, ...)
    processor: dict[str, Any] | None = None  # processor_config.json
    image_processor: dict[str, Any] | None = None  # preprocessor_config.json
    prepend_bos: bool = True  # the tokenizer prepends BOS (<|im_start|>) to every text
    hub_key: Callable[[str], str | None] = lambda name: name  # None: the checkpoint leaves it out (a tied lm_head)
    weights: Callable[[dict[str, Any]], None] | None = None  # a last change to the weights (placeholders drawn)


def model_config(module: Any, config: dict[str, Any]) -> Any:
    """`module`'s ModelConfig of `config`, with its module configs (text, vision, perceiver, ...), as mlx-vlm's
    load_model makes it."""
    from mlx_vlm.utils import update_module_configs

    config = copy.deepcopy(config)  # (some from_dict write into theirs)
    modules = ["text", "vision", "perceiver", "projector", "audio"]
    return update_module_configs(module.ModelConfig.from_dict(config), module, config, modules)


def write_folder(folder: Path, family: Family) -> Path:
    """Write `family`'s tiny folder into `folder`; returns it."""
    import importlib

    module = importlib.import_module(f"mlx_vlm.models.{family.module}")
    folder.mkdir(parents=True, exist_ok=True)
    built = parameters(seeded(lambda: module.Model(model_config(module, family.config))))
    if family.weights is not None:
        family.weights(built)
    weights = {}
    for name, weight in built.items():
        key = family.hub_key(name)
        if key is not None:
            weights[key] = _torch_conv(weight) if weight.ndim == 4 else weight
    save_weights(folder, weights)
    write_json(folder / "config.json", family.config)
    _write_generation_config(folder, family.eos)
    _write_tokenizer(folder, family.tokens, family.tokenizer, family.template, prepend_bos=family.prepend_bos)
    if family.processor is not None:
        write_json(folder / "processor_config.json", family.processor)
    if family.image_processor is not None:
        write_json(folder / "preprocessor_config.json", family.image_processor)
    return folder
