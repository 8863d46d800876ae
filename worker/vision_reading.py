"""How a vision-language model's image prompt is read when its embeddings are not one per prompt id, or not in place
of its image tokens.

Most of mlx-vlm's models put their image features in place of the image tokens the processor wrote: one embedding
per id. Some write fewer image tokens than they give embeddings (LLaVA-NeXT's `get_input_embeddings` puts each
crop's features, then as many `image_newline`s, in place of its first image tokens: 92 embeddings for 64 ids). Such
a model "expands", which the worker finds as the model loads (worker/vision.py's probe). Its prompt, as the batch and
the prefix cache see it, holds as many positions as its embeddings: the text before its first image token and after
its last as they are, and between them one tag per embedding (ids past the vocabulary, drawn from the images'
digests and the model's own ids there), so that the prompt's KV cache, its marks and its token count are the
sequence's own. The number of embeddings is read from the shape of mlx-vlm's computation, once, as the prompt is
measured (MLX computes lazily: nothing of the vision tower runs then); the model's own ids are kept by the tags
(`Span`), and the embeddings, read when the batch first reads the prompt, are checked against that length: any
disagreement fails that job (`Mismatch`), never a wrong answer.

Some put the image's features where their processor says (Molmo's and Jina VLM's `image_input_idx`: the places of
the patches' tokens, among the crops' start, column and end tokens; MiniCPM's `image_bound`: the spans between each
image's and slice's start and end tokens), whatever the tokens there: their prompt's images are named as an
expanding model's are, their span from the first such place to the last (one tag an id), and the places move with
the span when the kept arrays serve a prompt whose text before the images differs. (Such a prompt is always written
by the processor: its places are known from its arrays only.)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from tasks.errors import InvalidPrompt
from worker.batch.rows import Beside
from worker.vision_tower import READ, Arrays, Unreadable


class Mismatch(InvalidPrompt):
    """The model's embeddings of a prompt do not line up with its tokens (only that job fails)."""


@dataclass(frozen=True)
class Span:
    """Where an expanding model's images sit in a keyed prompt: from `start`, the model's own ids `ids` (its first
    image token to its last) stand as `length` tagged positions."""

    start: int
    ids: tuple[int, ...]
    length: int


def embeddings_length(vlm: Any, ids: list[int], kept: Arrays) -> int:
    """How many input embeddings mlx-vlm's `get_input_embeddings` gives for these ids and arrays: the shape of its
    computation, not computed."""
    return int(_embedded(vlm, ids, kept).inputs_embeds.shape[1])


def with_extras(vlm: Any, ids: list[int], kept: Arrays) -> tuple[mx.array, dict[str, mx.array]]:
    """The prompt's input embeddings, its images read in one call, and what the model gives beside them (`ALONGSIDE`);
    `Unreadable` names anything else it gives (positions that depend on the image, say)."""
    out = _embedded(vlm, ids, kept)
    extras = {k: v for k, v in out.to_dict().items() if v is not None and k not in READ}
    unknown = [k for k in extras if k not in ALONGSIDE]
    if unknown:
        raise Unreadable(", ".join(unknown))
    return out.inputs_embeds[0], extras


def _embedded(vlm: Any, ids: list[int], kept: Arrays) -> Any:
    """mlx-vlm's `get_input_embeddings` of the ids and the images' arrays (as its generate calls it)."""
    arrays = {k: mx.array(v).astype(getattr(mx, dtype)) if dtype else mx.array(v) for k, (v, dtype) in kept.items()}
    rest = {k: v for k, v in arrays.items() if k != "pixel_values"}
    return vlm.get_input_embeddings(
        mx.array([ids]), arrays.get("pixel_values"), mask=mx.ones((1, len(ids)), dtype=mx.int32), **rest
    )


def span_of(ids: list[int], image_token: int, length: int) -> Span:
    """The span of the images in a prompt of `ids` whose embeddings are `length` long; `Mismatch` if the text around
    the images would not fit in them."""
    at = [i for i, t in enumerate(ids) if t == image_token]
    if not at:
        raise Mismatch("the model's processor wrote no image token for the request's images")
    first, last = at[0], at[-1]
    inside = length - first - (len(ids) - last - 1)
    if inside < 1:
        raise Mismatch(
            f"the model's embeddings of the prompt ({length}) do not line up with its {len(ids)} tokens: "
            "onelane cannot read this prompt with its images"
        )
    return Span(start=first, ids=tuple(ids[first : last + 1]), length=inside)


def span_at(ids: list[int], at: list[int]) -> Span:
    """The span of the images in a prompt of `ids` whose features go to the places `at` (in order): from the first
    to the last, one embedding an id."""
    first, last = at[0], at[-1]
    return Span(start=first, ids=tuple(ids[first : last + 1]), length=last - first + 1)


#: the arrays in which a processor says where a model's image features go: each feature's place (-1 for none:
#: Molmo's, Jina VLM's), or each image's or slice's span of places, [start, end) (MiniCPM-V's, MiniCPM-o's), or where
#: each image's block starts, its length the difference of its `LENGTHS` (DeepSeek-V4's: the block's own ids)
PLACES = "image_input_idx"
BOUNDS = "image_bound"
OFFSETS, LENGTHS = "image_offsets", "image_type_offsets"


def placed_at(kept: Arrays, length: int) -> list[int] | None:
    """Where a prompt of `length` ids that its processor just wrote has its images' features, for a model that puts
    them where its processor says (`PLACES`, `BOUNDS`, `OFFSETS`); None for any other model."""
    if PLACES in kept:
        places = {int(i) for i in np.asarray(kept[PLACES][0]).reshape(-1)}
    elif BOUNDS in kept:
        places = {i for a, b in np.asarray(kept[BOUNDS][0]).reshape(-1, 2) for i in range(int(a), int(b))}
    elif OFFSETS in kept and LENGTHS in kept:
        ends = np.diff(np.asarray(kept[LENGTHS][0]).reshape(-1))
        places = {i for a, n in zip(np.asarray(kept[OFFSETS][0]).reshape(-1), ends) for i in range(int(a), int(a + n))}
    else:
        return None
    return sorted(i for i in places if 0 <= i < length) or None


def placed_for(kept: Arrays, start: int) -> Arrays:
    """The prepared arrays of a prompt's images, for a prompt whose images' span starts at `start`: a model's places
    of their features (`PLACES`, `BOUNDS`, `OFFSETS`) moved with it (the arrays are kept by the images: the prompt that made
    them may have had other text before them); any other model's as they are."""
    name = next((n for n in (PLACES, BOUNDS, OFFSETS) if n in kept), None)
    if name is None:
        return kept
    places, dtype = kept[name]
    inside = places >= 0
    if not inside.any():
        return kept
    moved = np.where(inside, places + (start - int(places[inside].min())), places)
    return {**kept, name: (moved.astype(places.dtype), dtype)}


def expanded(ids: list[int], span: Span, vocab: int, digests: tuple[str, ...], salt: int) -> list[int]:
    """The keyed prompt of an expanding model: the ids, their span of images as `span.length` tags drawn from the
    images' digests and the span's own ids (in two 28-bit pieces of a SHA-256, in turn, as worker/vision.py keys
    images); another `salt` draws other tags."""
    digest = hashlib.sha256(f"{salt}:{','.join(digests)}:{span.ids}".encode()).hexdigest()
    pieces = [vocab + int(digest[7 * k : 7 * k + 7], 16) for k in range(2)]
    tags = [pieces[k % 2] for k in range(span.length)]
    return [*ids[: span.start], *tags, *ids[span.start + len(span.ids) :]]


def model_ids(keyed: list[int], span: Span, vocab: int) -> list[int]:
    """A keyed prompt's ids as the model's `get_input_embeddings` reads them (its span of images its own again)."""
    first = next(i for i, t in enumerate(keyed) if t >= vocab)
    return [*keyed[:first], *span.ids, *keyed[first + span.length :]]


def prefix_lm(vlm: Any) -> bool:
    """Whether the model reads a prompt's prefix with bidirectional attention, so that mlx-vlm reads the whole prompt
    in one pass (its model's `chunked_prefill_policy` says not to chunk: PaliGemma). The batch reads such a model's
    image prompt so too, its last token included (worker/batch/prefill.py `_see`); decoding is causal as ever."""
    policy = getattr(vlm, "chunked_prefill_policy", None)
    if not callable(policy):
        return False
    return not policy(
        input_ids=None, inputs_embeds=None, prompt_cache=None, draft_model=None, draft_kind=None, prefill_kwargs=None
    )


def unchunked(vlm: Any, ids: list[int]) -> bool:
    """Whether mlx-vlm reads an image prompt of these ids in one pass, its last token too: its model's (or else its
    language model's) `chunked_prefill_policy`, asked of the ids as mlx-vlm's generate asks it (DeepSeek-V4's: its
    image blocks, read both ways, come in one pass on a fresh cache, and its answer's first token from that pass)."""
    for model in (vlm, getattr(vlm, "language_model", None)):
        policy = getattr(model, "chunked_prefill_policy", None)
        if callable(policy):
            return not policy(
                input_ids=mx.array([ids]),
                inputs_embeds=None,
                prompt_cache=None,
                draft_model=None,
                draft_kind=None,
                prefill_kwargs={},
            )
    return False


def first_pass_positions(vlm: Any) -> bool:
    """Whether the model rotates a prompt's image tokens by their own positions only in a cache's first pass, every
    later pass by its index (HunYuan VL's XD-RoPE: the positions `get_input_embeddings` computes for the prompt and
    keeps on its language model). mlx-vlm reads a prompt of up to 2,048 tokens in one pass, so the batch reads such a
    model's image prompt whole too, on its own cache (worker/batch/prefill.py `_see`), right after its embeddings
    set those positions; a pass that reads no embeddings drops them (`TextModel`: a text prompt's are its indices)."""
    return callable(getattr(vlm.language_model, "get_xdrope_input_positions", None))


#: what a model may give beside its embeddings that the batch passes to its language model, at each read of the
#: prompt and at the first decode step (Llama 3.2 Vision's cross-attention states and masks); such a model's image
#: jobs run alone in the lane (nothing else decodes beside them: the inputs are one sequence's)
ALONGSIDE = ("cross_attention_states", "cross_attention_mask", "full_text_row_masked_out_mask")
#: of those, what goes to every later decode step too (as mlx-vlm's generate_step passes them)
EVERY_STEP = ("cross_attention_states",)


def beside(extras: dict[str, mx.array]) -> Beside:
    """The inputs `get_input_embeddings` gave beside the embeddings, as the batch passes them."""
    return Beside(prompt=dict(extras), step={k: v for k, v in extras.items() if k in EVERY_STEP})


def for_ids(kept: Arrays, ids: list[int], image_token: int) -> Arrays:
    """The prepared arrays of a prompt's images for these ids: an array of the prompt's text (Llama 3.2 Vision's
    `cross_attention_mask`, a row per token) is written again for them, as its processor writes it (the arrays are
    kept by the images: another prompt's, of another length, may have made them)."""
    if "cross_attention_mask" not in kept:
        return kept
    from mlx_vlm.models.mllama.processing_mllama import (
        convert_sparse_cross_attention_mask_to_dense,
        get_cross_attention_token_mask,
    )

    mask, dtype = kept["cross_attention_mask"]
    tiles = (mask.max(axis=1) > 0).sum(axis=-1).tolist()  # each image's tiles (a row that sees it sees them all)
    dense = convert_sparse_cross_attention_mask_to_dense(
        [get_cross_attention_token_mask(ids, image_token)], tiles, mask.shape[-1], len(ids)
    )
    return {**kept, "cross_attention_mask": (dense.astype(mask.dtype), dtype)}
