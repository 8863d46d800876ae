"""A prompt's images prepared away from the device thread, and kept by their digests.

Decoding an image and running the model's processor on it (resizing, normalising: into pixel_values and the like)
take seconds of CPU on a real model's images. The device thread must not spend them: every other stream would stall
(ONELANE_DECODE_FLOOR). So the image preparer, a child process (worker/vision_child.py, run by tasks/children.py)
shared by every vision model the worker loads, does them, and a thread of this process waits for its answer; the
device thread only asks whether it is ready (a job whose images are being prepared waits, unclaimed, while the batch
steps), and later runs the vision tower on the prepared arrays.

What was prepared is kept by the images' full digests (SHA-256: an image's identity, never a prefix of it):

- the processor's arrays of a prompt's images (KEPT of them, the least recently used go first), which the vision
  tower reads;
- for each image, how the processor writes its tokens into the text's own (`Rule`: the edits around the image's
  placeholder token that turn the text's ids, as mlx-vlm tokenizes a prompt without images, into the processor's),
  derived from one prompt and kept only if they give back that prompt's ids exactly. A follow-up turn about images
  seen before is then tokenized without the processor: it reads no pixels, and if its prefix is cached, nor does
  the vision tower.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

import numpy as np

from tasks.children import ChildKind, Children
from tasks.errors import InvalidPrompt

logger = logging.getLogger(__name__)

NOT_INPUTS = ("input_ids", "attention_mask")  # what of mlx-vlm's prepared inputs is no image's
KEPT = 64  # prompts' prepared images kept (their arrays), by their digests ...
KEPT_BYTES = 2**30  # ... and their arrays' bytes, at most (the newest prompt's are kept whatever their size)
RULES = 4096  # images' rules kept (a few hundred bytes each)
PREPARERS = 1  # image preparer processes: one job's images at a time, beside the device thread
PREPARE_S = 120.0  # one prompt's images, at most (the door brought each down to twice the processor's size)
PREPARER = ChildKind(
    module="worker.vision_child", name="image preparer", size=PREPARERS, answer_s=PREPARE_S, wait_s=3600.0
)  # (asked from this module's threads only, one each: a free one is never far)
# the process's image preparers, shared by every vision model it loads (each request names its model's folder, and
# the child keeps the processors of the last few: worker/vision_child.py): a model loaded again, or another vision
# model, finds one started, not seconds of imports away
_PREPARERS = Children(PREPARER)

Edit = tuple[int, tuple[int, ...], tuple[int, ...]]  # at (from the placeholder), the ids there, the ids they become
Rule = tuple[Edit, ...]
Images = tuple[str, ...]  # a prompt's images' full digests, in order


class PrepareFailed(Exception):
    """The image preparer could not prepare a prompt's images (its message says why, for the operator's log)."""


@dataclass(frozen=True)
class Prepared:
    """A prompt as the processor wrote it: its token ids, and its images' arrays (name -> array, dtype)."""

    ids: tuple[int, ...]
    arrays: dict[str, tuple[np.ndarray, str]]


class Preparing(Exception):
    """A prompt's images are being prepared; `future` is done once they are (or failed)."""

    def __init__(self, future: Future[Prepared]) -> None:
        super().__init__("the prompt's images are being prepared")
        self.future = future


class Preparer:
    """The image preparer of one model (its folder and options), and what it prepared."""

    def __init__(self, path: str, options: dict[str, Any], image_token: int, special: bool) -> None:
        self.request = {"path": path, "options": options, "image_token": image_token, "special": special}
        self.children = _PREPARERS
        self.asked = 0  # requests of this model that went to the image preparer (each decodes its images)
        self._pool = ThreadPoolExecutor(max_workers=PREPARERS, thread_name_prefix="image-prep")
        self._lock = threading.Lock()
        self._arrays: OrderedDict[Images, dict[str, tuple[np.ndarray, str]]] = OrderedDict()
        self._rules: OrderedDict[str, Rule] = OrderedDict()
        self._asked: dict[tuple[str, Images], Future[Prepared]] = {}
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # (its files are memory: mapped, never on a disk)
        self._folder = tempfile.mkdtemp(prefix="onelane-images-", dir=shm)
        atexit.register(shutil.rmtree, self._folder, True)

    def close(self) -> None:
        """Forget what it prepared, and ask nothing more (a request under way ends; the preparer, shared, stays)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._arrays.clear()
            self._rules.clear()
        shutil.rmtree(self._folder, ignore_errors=True)

    def written(self, plain: list[int], marker: int | None, digests: Images) -> list[int] | None:
        """The prompt's ids as the processor would write them, from its text's ids and its images' kept rules;
        None if an image has none (or they do not fit this text)."""
        with self._lock:
            rules = [self._rules.get(d) for d in digests]
        if marker is None or any(r is None for r in rules):
            return None
        return apply(plain, marker, [r for r in rules if r is not None])

    def arrays(self, digests: Images) -> dict[str, tuple[np.ndarray, str]] | None:
        """The processor's arrays of these images, if kept (they stay the newest)."""
        with self._lock:
            found = self._arrays.get(digests)
            if found is not None:
                self._arrays.move_to_end(digests)
            return found

    def prepare(self, text: str, digests: Images, images: Callable[[], Mapping[str, bytes]], wait: bool) -> Prepared:
        """The prompt prepared by the image preparer (its images' bytes read by `images`, off the device thread):
        at once if it was asked already and has answered, else asked now; `Preparing` until it answers (unless
        `wait`), `PrepareFailed` if it could not, InvalidPrompt if an image is no longer kept."""
        key = (hashlib.sha256(text.encode()).hexdigest(), digests)
        with self._lock:
            future = self._asked.get(key)
            if future is None:
                future = self._pool.submit(self._ask, text, digests, images)
                self._asked[key] = future
        if not wait and not future.done():
            raise Preparing(future)
        with self._lock:
            self._asked.pop(key, None)
        return future.result()

    def _ask(self, text: str, digests: Images, read: Callable[[], Mapping[str, bytes]]) -> Prepared:
        found = read()
        if any(d not in found for d in digests):
            raise InvalidPrompt("an image of the request is no longer kept (its job outlived it): send it again")
        images = [found[d] for d in digests]
        header = {
            **self.request,
            "text": text,
            "digests": list(digests),
            "sizes": [len(i) for i in images],
            "folder": self._folder,
        }
        self.asked += 1
        try:
            answer, payload = self.children.ask(header, b"".join(images))
        except Exception as exc:
            raise PrepareFailed(f"the image preparer failed: {exc}") from exc
        if "error" in answer:
            raise PrepareFailed(answer["error"])
        if "invalid" in answer:
            raise InvalidPrompt(answer["invalid"])
        arrays = {}
        for name, path in answer["files"].items():  # mapped, not read: the device thread reads an image's rows
            arrays[name] = np.load(path, mmap_mode="r", allow_pickle=False), answer["dtypes"][name]
            os.unlink(path)
        with self._lock:
            self._arrays[digests] = arrays
            while len(self._arrays) > 1 and (len(self._arrays) > KEPT or _nbytes(self._arrays) > KEPT_BYTES):
                self._arrays.popitem(last=False)
            for done in [k for k, f in self._asked.items() if f.done()][:-KEPT]:  # (answers no job came back for)
                del self._asked[done]
            for digest, rule in answer["rules"].items():
                self._rules[digest] = tuple((int(at), tuple(old), tuple(new)) for at, old, new in rule)
                self._rules.move_to_end(digest)
            while len(self._rules) > RULES:
                self._rules.popitem(last=False)
        return Prepared(ids=tuple(answer["ids"]), arrays=arrays)


def _nbytes(kept: OrderedDict[Images, dict[str, tuple[np.ndarray, str]]]) -> int:
    return sum(a.nbytes for arrays in kept.values() for a, _ in arrays.values())


def placeholder(processor: Any) -> int | None:
    """The token a processor's chat template writes for an image (an added token, which only the image brings; of
    several, the processor's image token); None if it is not one such token, if the tokenizer has no chat template
    (GOT-OCR's: its processor writes the image's tokens into the words itself), or if the template renders no image
    part (mlx-vlm writes the image's placeholder into the text itself: Phi-4's <|image_1|>)."""
    tokenizer = getattr(processor, "tokenizer", processor)  # (a model without a processor of its own: its tokenizer)
    if not getattr(tokenizer, "chat_template", None):
        return None

    def ids(content: list[dict[str, str]]) -> list[int]:
        text = tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    words = {"type": "text", "text": "x"}
    added = set(tokenizer.get_added_vocab().values())
    try:
        brought = {t for t in ids([{"type": "image"}, words]) if t in added} - set(ids([words]))
    except Exception:  # (a template that renders a message's content only as a string: Phi-4's)
        return None
    if len(brought) > 1:  # (Qwen's <|vision_start|><|image_pad|><|vision_end|>: the one the processor expands)
        brought &= {getattr(processor, "image_token_id", None)}
    return brought.pop() if len(brought) == 1 else None


def derive(plain: list[int], ids: list[int], marker: int | None, digests: list[str]) -> dict[str, list[Edit]]:
    """Each image's rule, from a prompt's text ids (`plain`) and its ids as the processor wrote them: the edits
    nearest each placeholder; none at all unless they give back `ids` exactly."""
    at = [i for i, t in enumerate(plain) if t == marker]
    if marker is None or len(at) != len(digests) or not at:
        return {}
    edits: list[list[Edit]] = [[] for _ in at]
    for op, i1, i2, j1, j2 in SequenceMatcher(None, plain, ids, autojunk=False).get_opcodes():
        if op != "equal":
            n = min(range(len(at)), key=lambda n: abs(at[n] - i1))
            edits[n].append((i1 - at[n], tuple(plain[i1:i2]), tuple(ids[j1:j2])))
    rules = {d: e for d, e in zip(digests, edits, strict=True)}
    if apply(plain, marker, [tuple(rules[d]) for d in digests]) != ids:
        return {}
    return rules


def apply(plain: list[int], marker: int, rules: list[Rule]) -> list[int] | None:
    """The text's ids with each placeholder's edits made (its rule's, in order); None if they do not fit."""
    at = [i for i, t in enumerate(plain) if t == marker]
    if len(at) != len(rules):
        return None
    edits = []
    for p, rule in zip(at, rules, strict=True):
        for offset, old, new in rule:
            start = p + offset
            if start < 0 or tuple(plain[start : start + len(old)]) != old:
                return None
            edits.append((start, start + len(old), new))
    out, done = [], 0
    for start, end, new in sorted(edits, key=lambda e: e[0]):
        if start < done:
            return None
        out += [*plain[done:start], *new]
        done = end
    return [*out, *plain[done:]]
