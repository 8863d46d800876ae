"""The image preparer's own process: decodes a prompt's images and runs the model's processor on them (its text
and its images into token ids and pixel arrays), one request a time, as tasks/children.py runs its children.

The decode and the processor are CPU work of seconds on a real model's images: here they run beside the worker,
niced, with their CPU time and address space bounded, while its device thread steps the batch (worker/vision_prep.py
asks and waits off that thread). Images are read as mlx-vlm's own loader reads them (`load_image`: EXIF orientation
applied, RGB), and the inputs prepared as its generate prepares them (`prepare_inputs`), on the CPU; no array of
this process reaches the device.

A request is `{"path", "options", "text", "image_token", "special", "sizes", "digests", "folder"}` with the images'
bytes one after the other as its payload (`sizes` their lengths); the answer `{"ids", "rules", "files", "dtypes"}`
(the prompt's token ids, how each image's tokens are written into the text's own, by digest: worker/vision_prep.py;
the processor's arrays, each written to an .npy file of `folder`, which the worker maps and removes: tens of MB of
pixels are not copied through a socket), or `{"error"}`, or `{"invalid"}` (a prompt the model cannot read: the job's
own fault).
"""

from __future__ import annotations

import io
import json
import os
import uuid
from collections import OrderedDict
from typing import Any

import numpy as np

from tasks.children import serve
from worker.vision_prep import NOT_INPUTS, derive, placeholder

MEMORY_BYTES = 16 * 1024**3  # address space (MLX's import alone reserves a few GiB of it)
CPU_S = 120  # one request's CPU time, at most
NICE = 10  # below the worker: the device thread's Python comes first

PROCESSORS = 4  # models' processors kept (the worker's vision models share this process), the least recent go first

_processors: OrderedDict[str, tuple[Any, int | None]] = OrderedDict()


def main() -> None:
    os.nice(NICE)
    import mlx.core as mx

    mx.set_default_device(mx.cpu)  # (prepare_inputs makes MLX arrays: on the CPU here, never the device)
    serve(_handle, memory_bytes=MEMORY_BYTES, cpu_s=CPU_S)


def _handle(request: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
    try:
        return _prepare(request, payload)
    except Exception as exc:  # the worker logs it and fails the job
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}, b""


def _prepare(request: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
    from mlx_vlm.utils import load_image, prepare_inputs

    processor, marker = _processor(request["path"], request["options"])
    images, at = [], 0
    for size in request["sizes"]:
        images.append(load_image(io.BytesIO(payload[at : at + size])))
        at += size
    text, special, token = request["text"], bool(request["special"]), int(request["image_token"])
    inputs = prepare_inputs(processor, images=images, prompts=text, image_token_index=token, add_special_tokens=special)
    if np.asarray(inputs["input_ids"]).shape[0] != 1:  # (Molmo's writes the prompt once an image: its own row each)
        return {"invalid": "the model reads one image a prompt: send one image a request"}, b""
    plain = prepare_inputs(processor, prompts=text, add_special_tokens=special)
    ids = [int(t) for t in np.asarray(inputs["input_ids"])[0]]
    rules = derive([int(t) for t in np.asarray(plain["input_ids"])[0]], ids, marker, request["digests"])
    pixels = inputs.get("pixel_values")
    if pixels is not None and not _numbers(pixels):  # (DeepSeek-V4.1's: each image's patches and span as an object)
        while isinstance(pixels, list | tuple) and pixels:
            pixels = pixels[0]
        kind = type(pixels).__name__
        return {"error": f"its processor gives the images as {kind}, not arrays: onelane cannot carry them"}, b""
    files, dtypes = {}, {}
    for name, value in inputs.items():
        if name in NOT_INPUTS or value is None or not _numbers(value):
            continue
        dtypes[name] = str(getattr(value, "dtype", "")).removeprefix("mlx.core.").replace("bool", "bool_")
        files[name] = os.path.join(request["folder"], f"{uuid.uuid4().hex}.npy")
        np.save(files[name], np.asarray(value.astype(_float32()) if dtypes[name] == "bfloat16" else value))
    return {"ids": ids, "rules": rules, "files": files, "dtypes": dtypes}, b""


def _numbers(value: Any) -> bool:
    """Whether a processor's output is an array of numbers (an MLX array always is; DeepSeek-VL2's `sft_format`,
    its prompt's text, is not)."""
    return str(getattr(value, "dtype", "")).startswith("mlx.core.") or np.asarray(value).dtype.kind in "biuf"


def _float32() -> Any:
    import mlx.core as mx

    return mx.float32


def _processor(path: str, options: dict[str, Any]) -> tuple[Any, int | None]:
    """The model's processor, loaded as mlx-vlm's `load` loads it, and its image placeholder token (once a path,
    while it is among the PROCESSORS last asked for)."""
    key = json.dumps([path, options], sort_keys=True)
    if key in _processors:
        _processors.move_to_end(key)
    else:
        from mlx_vlm.utils import load_image_processor, load_processor

        image_processor = load_image_processor(path, **options)
        processor = load_processor(path, False, **options)
        if image_processor is not None:
            processor.image_processor = image_processor
        _processors[key] = processor, placeholder(processor)
        while len(_processors) > PROCESSORS:
            _processors.popitem(last=False)
    return _processors[key]


if __name__ == "__main__":
    main()
