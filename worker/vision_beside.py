"""What a vision-language model's language model reads beside a prompt's input embeddings, as the batch carries it.

mlx-vlm's `get_input_embeddings` gives, beside the embeddings (`InputEmbeddingsFeatures`):
- `position_ids` and `rope_deltas` (M-RoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen 3.5; GLM-4V sets them on its language
  model instead): not carried from there, but computed again for each sequence as it enters the batch, from its ids
  and its images' grids by the model's own `get_rope_index` (`rope_positions`), so that a sequence that reads no pixels (a
  prefix-cache hit, a resumed job, a choice of `n`, a preempted row put back) has them too (worker/batch/positions.py);
- `visual_pos_masks` and `deepstack_visual_embeds` (Qwen3-VL's and Cohere Compass's deepstack: the vision tower's
  features of some of its layers, added to the first text layers' hidden states at the image's tokens): carried to
  the prompt's read, `Deepstack`, chunk by chunk, each chunk given the features of the image tokens it holds
  (Qwen3-Omni's come placed at the prompt's tokens already, (1, tokens, layers, hidden), zero at the others': sliced
  with each chunk, as `PerToken`); Granite 4 Vision's are the whole prompt's instead (each layer's (prompt tokens,
  hidden), zero but at the image's tokens), which its language model slices itself at its cache's offset: carried,
  `ByPosition`, each chunk given them up to its end;
- `per_layer_inputs` (Gemma 3n, Gemma 4: an input per token for each layer), or `visual_pos_masks` alone (ZAYA1-VL:
  which tokens are the image's, whose own adapters its layers apply): carried, `PerToken`, sliced with each chunk.
Anything else is unknown: the model fails at load, naming it (worker/vision_tower.py: `Unreadable`).

Upstream, mlx-vlm's batch would take these per row: each row's `rope_deltas` (B, 1) and its own slice of the
deepstack features and per-layer inputs, instead of state kept on the language model for the last prompt.
"""

from __future__ import annotations

import dis
import inspect
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from worker.batch.positions import Positions
from worker.batch.rows import Extras

#: the embeddings' companions the batch computes again itself (worker/batch/positions.py), and those it carries
RECOMPUTED = ("position_ids", "rope_deltas")
CARRIED = ("visual_pos_masks", "deepstack_visual_embeds", "per_layer_inputs")


@dataclass(frozen=True)
class Deepstack:
    """Qwen3-VL's deepstack features of a prompt's tokens from `start` on: which tokens are the image's (`mask`), and
    for each of the first layers, the features of the image's tokens in order (`embeds`, from the `first`-th)."""

    mask: np.ndarray  # (prompt tokens,) bool
    embeds: tuple[mx.array, ...]  # each (image tokens, hidden)
    start: int = 0

    def take(self, start: int, length: int) -> dict[str, Any]:
        at = self.start + start
        before, inside = int(self.mask[:at].sum()), self.mask[at : at + length]
        if not inside.any():
            return {}
        k = int(inside.sum())
        return {
            "visual_pos_masks": mx.array(inside[None, :]),
            "deepstack_visual_embeds": [e[before : before + k] for e in self.embeds],
        }

    def after(self, start: int) -> Deepstack:
        return Deepstack(self.mask, self.embeds, self.start + start)


@dataclass(frozen=True)
class ByPosition:
    """Deepstack features laid out by the prompt's positions (Granite 4 Vision's: `mask` (1, prompt tokens), each of
    `embeds` (prompt tokens, hidden)), from `start` on. Its language model reads a chunk's own from them at its
    cache's offset, which, as a prompt with images is read on its own cache, is where the chunk starts in the prompt:
    each chunk is given them up to its end (a chunk without image tokens, none)."""

    mask: mx.array
    embeds: mx.array
    start: int = 0

    def take(self, start: int, length: int) -> dict[str, Any]:
        end = self.start + start + length
        if not bool(self.mask[:, self.start + start : end].any().item()):
            return {}
        return {"visual_pos_masks": self.mask[:, :end], "deepstack_visual_embeds": self.embeds[:, :end]}

    def after(self, start: int) -> ByPosition:
        return ByPosition(self.mask, self.embeds, self.start + start)


@dataclass(frozen=True)
class PerToken:
    """Inputs per token beside the embeddings (Gemma 3n's per-layer inputs: (1, tokens, ...)), from `start` on."""

    name: str
    values: mx.array
    start: int = 0

    def take(self, start: int, length: int) -> dict[str, Any]:
        at = self.start + start
        return {self.name: self.values[:, at : at + length]}

    def after(self, start: int) -> PerToken:
        return PerToken(self.name, self.values, self.start + start)


def carried(features: dict[str, Any]) -> Deepstack | ByPosition | PerToken | None:
    """What of the embeddings' companions the prompt's read carries (see the module's docstring): deepstack features
    as long as the prompt, and more of them than its image tokens, are laid out by its positions."""
    deepstack, masks = features.get("deepstack_visual_embeds"), features.get("visual_pos_masks")
    deepstack = getattr(deepstack, "embeddings", deepstack)  # (Cohere Compass's: the features beside their mask)
    if isinstance(deepstack, mx.array) and deepstack.ndim == 4:  # already placed at its tokens: Qwen3-Omni's
        return PerToken("deepstack_visual_embeds", deepstack)
    if deepstack is not None and masks is not None:
        mask = np.asarray(masks[0]).astype(bool)
        if isinstance(deepstack, mx.array) and deepstack.ndim == 3 and deepstack.shape[1] == mask.size > mask.sum():
            return ByPosition(masks, deepstack)
        return Deepstack(mask, tuple(deepstack))
    if features.get("per_layer_inputs") is not None:
        return PerToken("per_layer_inputs", features["per_layer_inputs"])
    if masks is not None:
        return PerToken("visual_pos_masks", masks)
    return None


def after(extras: Extras | None, start: int) -> Extras | None:
    """The extras of a prompt's tokens from `start` on (its cached tokens are not read)."""
    return extras.after(start) if isinstance(extras, Deepstack | ByPosition | PerToken) else None


def rope_indexed(language: Any) -> bool:
    """Whether a language model's positions depend on its images as Qwen-VL's do: its `get_rope_index` places a
    prompt's image tokens from their grids (`image_grid_thw`), which its code reads (MiniMax-M3-VL's takes them and
    deletes them unread: one position a token, its cache's). Decided from the code, not by calling it: a call would
    leave its result on some language models (Qwen3-VL's)."""
    found = _rope_index(language)
    return found is not None and any(_reads(i, "image_grid_thw") for i in dis.get_instructions(found))


def counts_itself(language: Any) -> bool:
    """Whether a language model not `rope_indexed` would still compute a batch's positions itself, from the rope
    deltas it keeps of the last batch, a row each (MiniMax-M3-VL's: wrong, or failing, as the batch's rows change):
    the batch then passes each row's plain positions (worker/vision.py `TextModel`)."""
    return _rope_index(language) is not None and not rope_indexed(language)


def _rope_index(language: Any) -> Any:
    """The language model's `get_rope_index`, where it takes the images' grids (`image_grid_thw`); else None."""
    found = getattr(language, "get_rope_index", None)
    return found if callable(found) and "image_grid_thw" in inspect.signature(found).parameters else None


def _reads(instruction: dis.Instruction, name: str) -> bool:
    """Whether a bytecode instruction loads the local `name` (3.13's LOAD_FAST_LOAD_FAST loads two)."""
    value = instruction.argval
    return instruction.opname.startswith("LOAD_FAST") and (value == name or isinstance(value, tuple) and name in value)


def positions_last(language: Any) -> bool:
    """Whether a positional language model takes its positions as (B, L, 3) (ERNIE 4.5 VL's), not (3, B, L) as
    Qwen-VL's: the shape its `get_rope_index` gives a text of two tokens. (The batch computes them as (3, B, L):
    worker/batch/positions.py; such a model's are turned as it reads them.)"""
    try:
        found, _ = language.get_rope_index(mx.array([[0, 0]]))
    except Exception:  # (a model that cannot place a text without its images: Qwen-VL's layout)
        return False
    return tuple(found.shape) == (1, 2, 3)


def rope_positions(language: Any, ids: list[int], image_token: int, grids: np.ndarray) -> Positions:
    """A keyed prompt's positions (its ids as the model knows them; `grids`: its images' (t, h, w), in order), by
    the model's `get_rope_index` over the prompt up to its last image token; past that, each token's index + delta."""
    last = max(i for i, t in enumerate(ids) if t == image_token) + 1
    found, deltas = language.get_rope_index(mx.array([ids[:last]]), image_grid_thw=mx.array(grids))
    if found.ndim == 3 and found.shape[0] == 1 and found.shape[2] == 3:  # (B, L, 3): ERNIE 4.5 VL's
        found = found.transpose(2, 0, 1)
    if found.ndim != 3 or found.shape[0] != 3:
        raise ValueError(f"get_rope_index gave positions of shape {found.shape}, not (3, 1, tokens)")
    head = np.asarray(found[:, 0, :]).astype(np.int32)
    return Positions(head, int(np.asarray(deltas).reshape(-1)[0]))
