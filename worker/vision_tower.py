"""The vision tower's pass over a prompt's images, on the device thread, bounded to one image a step.

A prompt of several images read in one call of the model's `get_input_embeddings` holds the device for all of them
at once: every other stream waits that long for its next token (ONELANE_DECODE_FLOOR). Read image by image instead,
each in a step of its own between the batch's steps (worker/batch/prefill.py calls `Reading` until it gives the
embeddings), a stream waits one image's pass at most. An image alone is read as the model reads it (its own tokens,
its own arrays: the rows of each array for that image), and the text's tokens as the model embeds text; the
embeddings are the whole call's wherever the model's images are read independently of each other, which is checked
once as the model loads (`by_image_agrees`): a model whose arrays do not split by image, or whose images' embeddings
differ read alone, is read in one call (its whole pass then bounds the wait: ONELANE_MAX_IMAGES images' worth).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np

from worker.batch.rows import Extras
from worker.vision_beside import CARRIED, RECOMPUTED, carried

#: what mlx-vlm's embeddings may carry beside them that the batch reads (worker/vision_beside.py: positions it computes
#: again itself, extras it carries): a model whose images need more (cross-attention states, ...) is not served yet
READ = ("inputs_embeds", "attention_mask_4d", "attention_mask", *RECOMPUTED, *CARRIED)

Arrays = dict[str, tuple[np.ndarray, str]]  # the processor's arrays of a prompt's images (and their MLX dtypes)
Reading = Callable[[], mx.array | tuple[mx.array, Extras] | None]  # a part of the pass a call; then the embeddings


def whole(vlm: Any, ids: list[int], kept: Arrays) -> mx.array | tuple[mx.array, Extras]:
    """The prompt's input embeddings, its images read in one call, with what the prompt's read carries beside them
    if anything (worker/vision_beside.py); `Unreadable` names what else the model gives."""
    arrays = {k: mx.array(v).astype(getattr(mx, dtype)) if dtype else mx.array(v) for k, (v, dtype) in kept.items()}
    rest = {k: v for k, v in arrays.items() if k != "pixel_values"}
    out = vlm.get_input_embeddings(
        mx.array([ids]), arrays.get("pixel_values"), mask=mx.ones((1, len(ids)), dtype=mx.int32), **rest
    )
    features = {k: v for k, v in out.to_dict().items() if v is not None}
    extra = [k for k in features if k not in READ]
    if extra:
        raise Unreadable(", ".join(extra))
    embeds: mx.array = out.inputs_embeds[0]
    extras = carried(features)
    return (embeds, extras) if extras is not None else embeds


class Unreadable(Exception):
    """The model gives more than embeddings for its images (its message names what)."""


def splits(kept: Arrays, images: int) -> bool:
    """Whether the images' arrays split into each image's own (`each_image`)."""
    return _each_image(kept, images) is not None


def _each_image(kept: Arrays, images: int) -> list[Arrays] | None:
    """Each image's own arrays: the rows of every array for it, where each array has a row an image (its first axis),
    or, for a model whose processor flattens its images' patches into one array and says each one's grid
    (`image_grid_thw`: Qwen-VL's), that image's patches (t x h x w of them) and its grid; None if they do not split."""
    if images <= 0:
        return None
    grid = kept.get("image_grid_thw")
    if grid is not None and grid[0].shape[:1] == (images,):
        bounds = np.cumsum([0, *(int(np.prod(g)) for g in grid[0])])
        spans = [(int(bounds[n]), int(bounds[n + 1])) for n in range(images)]
        if not all(v.shape[:1] in ((images,), (int(bounds[-1]),)) for v, _ in kept.values()):
            return None
        return [
            {k: (v[n : n + 1] if v.shape[:1] == (images,) else v[a:b], t) for k, (v, t) in kept.items()}
            for n, (a, b) in enumerate(spans)
        ]
    if not all(v.shape[:1] == (images,) for v, _ in kept.values()):
        return None
    return [{k: (v[n : n + 1], t) for k, (v, t) in kept.items()} for n in range(images)]


def _runs(at: list[int], images: int) -> list[list[int]]:
    """The image tokens' places, image by image: each image's run of consecutive places where there are as many runs
    as images (images of different sizes: Qwen-VL's), else split evenly (an image of several runs, tile by tile)."""
    runs: list[list[int]] = []
    for i in at:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    if len(runs) == images:
        return runs
    each = len(at) // images
    return [at[n * each : (n + 1) * each] for n in range(images)]


def by_image(vlm: Any, image_token: int, ids: list[int], kept: Arrays, images: int) -> Reading:
    """The pass image by image: each call reads one image; the call after the last gives the embeddings."""
    at = [i for i, t in enumerate(ids) if t == image_token]
    runs = _runs(at, images)
    mine = _each_image(kept, images)
    assert mine is not None, "read image by image only where its arrays split"
    parts: list[mx.array] = []

    def read() -> mx.array | None:
        n = len(parts)
        if n < images:
            part = whole(vlm, [image_token] * len(runs[n]), mine[n])
            assert not isinstance(part, tuple), "a model whose embeddings carry extras is read in one call"
            mx.eval(part)
            parts.append(part)
            return None
        text = vlm.get_input_embeddings(mx.array([ids]), None, mask=mx.ones((1, len(ids)), dtype=mx.int32))
        embeds: mx.array = text.inputs_embeds[0]
        embeds[mx.array(at)] = mx.concatenate(parts).astype(embeds.dtype)
        return embeds

    return read


def by_image_agrees(vlm: Any, image_token: int, ids: list[int], kept: Arrays, images: int) -> bool:
    """Whether reading image by image gives the whole call's embeddings (for a prompt of several images)."""
    if not splits(kept, images) or isinstance(together := whole(vlm, ids, kept), tuple):
        return False
    reading = by_image(vlm, image_token, ids, kept, images)
    try:
        while (alone := reading()) is None:
            pass
    except Exception:  # (an image alone that the model cannot read without its prompt's text: read in one call)
        return False
    assert not isinstance(alone, tuple)
    return bool(alone.shape == together.shape and mx.allclose(alone, together, atol=1e-4, rtol=1e-3).item())
