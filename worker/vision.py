"""A vision-language model in the batch: mlx-vlm's model and processor, read as mlx-vlm's own generate reads them.

A prompt with images is rendered by the processor's chat template (each image a `{"type": "image"}` part where the
message holds it), then tokenized and its images prepared by the processor, which writes each image as its run of
image tokens: by the image preparer, a child process, away from the device thread (worker/vision_prep.py), or, for
images seen before, from their kept rules without the processor. Its input embeddings (the vision tower's features in
place of those tokens, the rest the token embeddings) come from the model's `get_input_embeddings` when the batch
first reads the prompt, one image a step where the model allows (worker/vision_tower.py); the batch reads them in
chunks beside the others' decode steps (worker/batch/prefill.py), and from then on the sequence decodes as any other,
through the language model. What the language model reads beside the embeddings goes with them: a model whose
positions depend on its images (M-RoPE: Qwen-VL, GLM-4V) is given each sequence's own, computed as it enters the batch
(`positions`: worker/batch/positions.py), and Qwen3-VL's deepstack features reach the prompt's read chunk by chunk
(worker/vision_beside.py).

What the batch sees of an image is a tag made from its digest: the ids of its tokens are replaced by ids past the
vocabulary and past every id its tokenizer gives (`_keyed`: two 28-bit pieces of its SHA-256 in turn, every id a
32-bit integer, as the batch's arrays hold them; drawn again from a salted digest in the rare case another image's
prompt holds the same tags), so that two prompts alike but for their image never share a cached prefix. Where cached
state could be shared, the full digest decides: the prepared arrays are kept by the images' full digests, and every
prefix-cache entry carries the full digests of its images (`marks`), which a hit must match. A follow-up about the
same image, whose prefix is cached, reads no pixels again.
"""

from __future__ import annotations

import hashlib
import io
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from tasks.catalogue import ModelConfig
from tasks.chat_prompt import chat_input
from tasks.errors import InvalidPrompt
from tasks.job import JobSpec, Message, Picture
from worker.batch.dtypes import with_dtype
from worker.batch.engine import Engine, Images
from worker.batch.forward import ContinuousBatch
from worker.batch.positions import Positions, from_offset
from worker.batch.rows import Beside, Embeds, Extras
from worker.unsupported import Unsupported
from worker.vision_beside import after, counts_itself, positions_last, rope_indexed, rope_positions
from worker.vision_prep import KEPT, PrepareFailed, Preparer, placeholder
from worker.vision_reading import (
    PLACES,
    Mismatch,
    Span,
    beside,
    embeddings_length,
    expanded,
    first_pass_positions,
    for_ids,
    model_ids,
    placed_at,
    placed_for,
    prefix_lm,
    span_at,
    span_of,
    unchunked,
    with_extras,
)
from worker.vision_tower import Arrays, Unreadable, by_image, by_image_agrees, splits, whole

logger = logging.getLogger(__name__)

Source = tuple[str, dict[str, Any]]  # the model's folder and mlx-vlm's options, as the image preparer loads it
Reach = Callable[[list[int]], int] | None  # how many of a keyed prompt's tokens the prefix cache holds


class VisionUnsupported(Unsupported):
    """A vision-language model whose images the batch cannot read yet (its message says why)."""


class TextModel(nn.Module):
    """A vision-language model's language model as the batch drives an mlx-lm model: token ids (or input
    embeddings) in, logits out, its layers and its caches."""

    def __init__(self, vlm: nn.Module) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # (mlx's Module.__init__ is unannotated)
        self.vlm = vlm
        # whether its positions depend on its images (M-RoPE): the batch then passes every row's own
        # (worker/batch/positions.py)
        self.positional = rope_indexed(vlm.language_model)
        self.last = self.positional and positions_last(vlm.language_model)  # its positions (B, L, 3): ERNIE's
        self.first_pass = first_pass_positions(vlm)  # its image positions kept for a cache's first pass: HunYuan VL's
        self.counts = counts_itself(vlm.language_model)  # it is given plain positions (B, L), not left to count them

    def __call__(
        self,
        inputs: mx.array,
        cache: Any = None,
        inputs_embeds: mx.array | None = None,
        positions: mx.array | None = None,
        **extras: Any,
    ) -> mx.array:
        """The logits; a positional model is given `positions` (3, B, L), or, outside the batch (the probes, on a
        fresh cache), text positions from its cache's offset: never the last prompt's it keeps itself. One that
        `counts_itself` is given its rows' plain positions from its cache's offsets (B, L), as a batched cache
        rotates an mlx-lm model's. (`extras`:
        what a prompt's read or a sequence alone's passes take beside the embeddings: worker/batch/rows.py.)"""
        if positions is None and (self.positional or self.counts):
            offset = next((c.offset for c in cache or () if hasattr(c, "offset")), 0)  # (a linear layer's has none)
            positions = from_offset(offset, inputs.shape[0], inputs.shape[1])
        if positions is not None:
            extras["position_ids"] = (
                positions[0] if self.counts else positions.transpose(1, 2, 0) if self.last else positions
            )
        if self.first_pass and inputs_embeds is None:  # (not an image prompt's read: the last one's positions go)
            self.vlm.language_model._position_ids = None
        out = self.vlm.language_model(inputs, inputs_embeds=inputs_embeds, cache=cache, **extras)
        return getattr(out, "logits", out)  # type: ignore[no-any-return]  # (mlx-vlm's language models are untyped)

    @property
    def layers(self) -> list[nn.Module]:
        return self.vlm.language_model.layers  # type: ignore[no-any-return]  # (mlx-vlm's language models are untyped)

    def make_cache(self) -> list[Any]:
        from mlx_lm.models.cache import KVCache

        language = self.vlm.language_model
        return language.make_cache() if hasattr(language, "make_cache") else [KVCache() for _ in self.layers]


class VisionEngine(Engine):
    """An engine whose prompts may hold images (see the module's docstring)."""

    def __init__(
        self, vlm: nn.Module, processor: Any, tokenizer: Any, name: str, source: Source, **options: Any
    ) -> None:
        from mlx_vlm.utils import should_add_special_tokens

        super().__init__(TextModel(vlm), tokenizer, name, **options)
        self.vlm, self.processor = vlm, processor
        self.image_token = int(_image_token(vlm))
        self.tags = _first_tag(self.vocab, processor)  # where its images' tags start (past any id it reads)
        self.special = bool(should_add_special_tokens(vlm.config.model_type, processor))
        self.marker = placeholder(processor)  # the token the template writes for an image
        self.prep = Preparer(source[0], source[1], self.image_token, self.special)
        # the full digests of the prompts' images seen last, by their ids past the vocabulary
        self._digests: OrderedDict[tuple[int, ...], tuple[str, ...]] = OrderedDict()
        self.by_image = False  # its images read one a step (worker/vision_tower.py): checked as it loads
        self.expands = False  # its embeddings outnumber its prompt's ids (worker/vision_reading.py): found as it loads
        self.placed = False  # its features go where its processor says (Molmo, Jina VLM, MiniCPM-V): found as it loads
        self.prefix_lm = prefix_lm(vlm)  # it reads an image prompt's prefix both ways, in one pass (PaliGemma)
        self.whole = self.prefix_lm or first_pass_positions(vlm)  # it reads an image prompt in one pass
        self.images_alone = False  # its images come with inputs to every step: its image jobs run alone (probe)
        self.reset()  # (its batch knows it)
        self._whole = 0  # (its image prompts' own marks)
        self._spans: OrderedDict[tuple[int, ...], Span] = OrderedDict()  # an expanding model's, by the tags
        self._lengths: OrderedDict[tuple[tuple[str, ...], tuple[int, ...]], int] = OrderedDict()  # its embeddings'
        self.images_read = 0  # images its vision tower read (a prefix-cache hit reads none)
        self.positional = rope_indexed(vlm.language_model)  # (its TextModel's: M-RoPE)
        self.gridded = self.positional  # its images' grids move its positions: checked as it loads
        self._grids: OrderedDict[str, np.ndarray] = OrderedDict()  # each image's grid (t, h, w), by its digest

    @classmethod
    def load(  # type: ignore[override]  # (from a ModelConfig only, not also a path as Engine.load)
        cls, model: ModelConfig, max_batch: int = 1, prefill_step: int = 512, lock: Any = None
    ) -> VisionEngine:
        """Load a vision-language model's folder (or hub id) with mlx-vlm, and its tokenizer as mlx-lm wraps one (its
        processor's, where transformers cannot load it: a tokenizer of mlx-vlm's own code, as PLaMo 2 VL's)."""
        from mlx_lm.tokenizer_utils import TokenizerWrapper
        from mlx_lm.tokenizer_utils import load as load_tokenizer
        from mlx_vlm import load as load_vlm
        from mlx_vlm.utils import get_model_path

        started = time.perf_counter()
        vlm, processor = load_vlm(model.path, trust_remote_code=model.trust_remote_code, revision=model.revision)
        dtype = with_dtype(vlm, model.dtype)
        folder = Path(getattr(vlm.config, "_name_or_path", "") or model.path)
        eos = _eos(vlm.config, processor)
        try:
            tokenizer = load_tokenizer(folder if folder.is_dir() else _folder_of(model.path), eos_token_ids=eos)
        except ValueError:  # (transformers knows no such tokenizer: "Couldn't instantiate the backend tokenizer")
            tokenizer = TokenizerWrapper(getattr(processor, "tokenizer", processor), eos_token_ids=eos)
        logger.info(
            "model %s loaded from %s in %.2f s (%s; reads images)",
            model.name,
            model.path,
            time.perf_counter() - started,
            dtype,
        )
        engine = cls(
            vlm,
            processor,
            tokenizer,
            model.name,
            (str(get_model_path(model.path, revision=model.revision)), {"trust_remote_code": model.trust_remote_code}),
            max_batch=max_batch,
            prefill_step=prefill_step,
            lock=lock,
            max_kv_size=model.max_kv_size,
        )
        engine.probe()
        return engine

    def probe(self) -> None:
        """Two images read as it loads (one, for a model whose processor takes one image a prompt, as PaliGemma's): a
        model whose images the batch cannot read fails its load, saying why; one whose images read alone give the
        embeddings they give together is read one image a step; one whose embeddings outnumber its ids expands."""
        prompt = self._probe_prompt()
        ids, kept, count = self._inputs(prompt)
        try:
            embeds, extras = with_extras(self.vlm, ids, for_ids(kept, ids, self.image_token))
        except Unreadable as exc:
            raise _unsupported(exc) from None
        self.images_alone = bool(extras)
        if unchunked(self.vlm, ids) and not self.whole:
            raise VisionUnsupported(
                "mlx-vlm reads its image prompt in one pass, its last token too, and answers from that pass (its image "
                "blocks read both ways: DeepSeek-V4's); onelane's batch reads a prompt's last token in a step of its "
                "own, which such a model reads otherwise: it does not read its images yet"
            )
        length = int(embeds.shape[0])
        self.expands = length != len(ids)
        reading = self._reading(ids, kept, 0, count, length)
        while reading() is None:
            pass
        # (a positional model whose processor gives no grids: its images do not move its positions, MiniCPM-V's)
        self.gridded = self.positional and "image_grid_thw" in kept
        if self.gridded:  # (its positions, as the batch will compute them for each sequence)
            try:
                self.positions(prompt)
            except (InvalidPrompt, ValueError, TypeError) as exc:
                raise VisionUnsupported(
                    f"its positions depend on its images in a way onelane does not follow ({exc})"
                ) from None
        self.by_image = not (self.expands or self.images_alone or self.placed) and by_image_agrees(
            self.vlm, self.image_token, ids, kept, count
        )
        self.images_read = 0
        self._say_how_it_reads()

    def _probe_prompt(self) -> list[int]:
        """The probe's prompt: two small images (one, for a model that takes one image a prompt) and a question."""
        from PIL import Image

        images = {}
        for n, color in enumerate(("gray", "teal")):
            out = io.BytesIO()
            Image.new("RGB", (32, 32), color).save(out, "PNG")
            images[str(n) * 64] = out.getvalue()
        try:
            return self.prompt_tokens(_asking(self.name, images), images)
        except (PrepareFailed, InvalidPrompt):  # (a model that takes one image a prompt)
            one = dict(list(images.items())[:1])
            return self.prompt_tokens(_asking(self.name, one), one)

    def _say_how_it_reads(self) -> None:
        logger.info(
            "model %s reads %s%s%s%s%s%s",
            self.name,
            "one image a step" if self.by_image else "a prompt's images at once",
            "; its image jobs run alone (their images go to every step)" if self.images_alone else "",
            "; its images give more embeddings than their tokens: its prompts hold as many" if self.expands else "",
            "; its images' features go where its processor says" if self.placed else "",
            "; its image prompts whole, in one pass (a prefix read both ways)" if self.prefix_lm else "",
            "; its image prompts whole, in one pass (its image positions a first pass's)"
            if self.whole > self.prefix_lm
            else "",
        )

    def _new_batch(self) -> ContinuousBatch:
        batch = super()._new_batch()
        batch.whole_prompts = getattr(self, "whole", False)  # (the first batch is made before it is known)
        return batch

    def prompt_tokens(
        self, spec: JobSpec, images: Images = None, *, wait: bool = True, reach: Reach = None
    ) -> list[int]:
        """The prompt's keyed ids (see the module's docstring). Its images are prepared by the image preparer
        (worker/vision_prep.py), unless each has a kept rule and their arrays are kept or not needed (`reach`: how
        much of the keyed prompt the prefix cache holds); `Preparing` while they are, unless `wait`."""
        digests = tuple(p.digest for m in spec.messages or () for p in sorted(m.images, key=lambda p: p.at))
        if not digests and spec.messages is None:
            return super().prompt_tokens(spec)
        if not digests:  # (a conversation without images: rendered and tokenized as mlx-vlm's generate does too)
            tokens = self._plain(self._text(spec))
            if not tokens:
                raise InvalidPrompt("the prompt is empty once tokenized: there is nothing to continue")
            return tokens
        text = self._text(spec)
        written = self.prep.written(self._plain(text), self.marker, digests)
        # (a model whose features go where its processor says has its prompts written by the processor: its places)
        if written is not None and not self.placed and (not self.expands or (digests, tuple(written)) in self._lengths):
            keyed = self._keyed(written, digests)
            if self.prep.arrays(digests) is not None or (  # (a model alone needs its images at every step)
                reach is not None and not self.images_alone and reach(keyed) > _last_image(keyed, self.tags)
            ):
                return keyed
        read = images if callable(images) else lambda: images or {}
        prepared = self.prep.prepare(text, digests, read, wait)
        return self._keyed(list(prepared.ids), digests, prepared.arrays)

    def _text(self, spec: JobSpec) -> str:
        """The prompt rendered as mlx-vlm renders a chat (`apply_chat_template`, as its generate and its server do:
        each architecture's message format, then the processor's own template where it has one, as InternVL's, else
        its tokenizer's), each image an image part where its message holds it, its text parts under both `text` and
        `content` as mlx-vlm's messages hold them."""
        from mlx_vlm.prompt_utils import apply_chat_template

        assert spec.messages is not None
        messages, tools = chat_input(spec.messages, spec.tools, self.tokenizer)
        offset = len(messages) - len(spec.messages)  # (a system message telling of tools may come first)
        for i, m in enumerate(spec.messages):
            turn = messages[i + offset]
            if m.images:
                words = turn["content"] if turn["content"] != m.content else None
                turn["content"] = _content(m.parts(), words)
        extra: dict[str, Any] = {"tools": tools} if tools else {}
        count = sum(len(m.images) for m in spec.messages)
        try:
            text = apply_chat_template(self.processor, self.vlm.config, messages, num_images=count, **extra)
        except ValueError as exc:  # (mlx-vlm's own refusal, in words for the client: "... only use 1 image")
            raise InvalidPrompt(f"the model cannot read this prompt: {exc}") from None
        if not isinstance(text, str):  # (a model that reads only the last message gets it as a message)
            text = str(text.get("content", "")) if isinstance(text, dict) else str(text)
        return text

    def _plain(self, text: str) -> list[int]:
        """The text's ids as mlx-vlm tokenizes a prompt without images."""
        from mlx_vlm.utils import prepare_inputs

        inputs = prepare_inputs(self.processor, prompts=text, add_special_tokens=self.special)
        return [int(t) for t in np.asarray(inputs["input_ids"])[0]]

    def close(self) -> None:
        """Let go of the batch, and of the image preparer with what it kept (the model is about to be evicted)."""
        super().close()
        self.prep.close()

    def marks(self, tokens: list[int]) -> tuple[tuple[int, str], ...]:
        """The full digests of a keyed prompt's images, where each starts. An image prompt read whole (a prefix-LM's:
        each token's state depends on every other's of its prefix; HunYuan VL's: a later pass would not place its
        images) has a mark of its own at its start, which no other matches: its cached state goes to no other prompt
        (worker/prefix_index.py `within`)."""
        at = [i for i, t in enumerate(tokens) if t >= self.tags]
        digests = self._digests.get(tuple(tokens[i] for i in at)) if at else None
        if not digests:
            return ()
        each = len(at) // len(digests)
        marks = tuple((at[n * each], d) for n, d in enumerate(digests))
        if self.whole:
            self._whole += 1
            return ((0, f"read whole {self._whole}"), *marks)
        return marks

    @property
    def images(self) -> str:
        """How its image prompts run, found as it loads: `alone` (its images go to every step: Llama 3.2 Vision),
        `whole` (read in one pass: PaliGemma, HunYuan VL), else `batched` (beside the others)."""
        return "alone" if self.images_alone else "whole" if self.whole else "batched"

    def runs_alone(self, prompt: list[int]) -> bool:
        """Whether the prompt is an image prompt of a model whose images go to every step (Llama 3.2 Vision's
        cross-attention states): it runs alone, its text jobs batch."""
        return self.images_alone and any(t >= self.tags for t in prompt)

    def embeddings(self, prompt: list[int], cached: int) -> tuple[Embeds | None, list[int] | None]:
        """The prompt's input embeddings past its first `cached` tokens, but its last, read when first needed, between
        two of the batch's steps, image by image where the model allows (worker/vision_tower.py); and their ids. A
        model whose images go to every step reads them whatever its cache holds of the prompt."""
        if not any(t >= self.tags for t in (prompt if self.runs_alone(prompt) else prompt[cached:-1])):
            return None, None
        ids, kept, images = self._inputs(prompt)
        batch_ids = ids if len(ids) == len(prompt) else [self.image_token if t >= self.tags else t for t in prompt]
        return self._reading(ids, kept, cached, images, len(prompt)), batch_ids[cached:]

    def positions(self, prompt: list[int]) -> Positions | None:
        """A keyed prompt's own positions where the model's depend on its images (worker/vision_beside.py), from its
        ids and its images' grids (kept by digest: a prompt whose images' arrays are gone still has them); None for
        text positions (a model whose images have no grids: M-RoPE over text positions, as MiniCPM-V's)."""
        if not self.gridded or not any(t >= self.tags for t in prompt):
            return None
        digests = self._digests.get(_images(prompt, self.tags))
        if digests is None:
            raise InvalidPrompt("the prompt's images are no longer held by the worker: send the request again")
        arrays = self.prep.arrays(digests)
        if arrays is not None and "image_grid_thw" in arrays:
            for digest, grid in zip(digests, np.asarray(arrays["image_grid_thw"][0]).reshape(-1, 3)):
                self._grids[digest] = grid
                self._grids.move_to_end(digest)
            while len(self._grids) > KEPT * 64:
                self._grids.popitem(last=False)
        grids = [g for d in digests if (g := self._grids.get(d)) is not None]
        if len(grids) < len(digests):
            raise InvalidPrompt("the prompt's images are no longer held by the worker: send the request again")
        ids = [self.image_token if t >= self.tags else t for t in prompt]
        return rope_positions(self.vlm.language_model, ids, self.image_token, np.stack(grids))

    def _inputs(self, prompt: list[int]) -> tuple[list[int], Arrays, int]:
        """A keyed prompt's ids as the model's `get_input_embeddings` reads them, its images' prepared arrays, and
        how many images."""
        tags = _images(prompt, self.tags)
        digests, span = self._digests.get(tags), self._spans.get(tags)
        arrays = self.prep.arrays(digests) if digests is not None else None
        if digests is None or arrays is None or (self.expands and span is None):
            raise InvalidPrompt("the prompt's images are no longer held by the worker: send the request again")
        if span is not None:
            return model_ids(prompt, span, self.tags), placed_for(arrays, span.start), len(digests)
        return [self.image_token if t >= self.tags else t for t in prompt], arrays, len(digests)

    def _reading(self, ids: list[int], kept: Arrays, cached: int, images: int, length: int) -> Embeds:
        """The vision tower's pass, a part a call (one image, or all at once), then the embeddings past `cached`
        of a prompt `length` long (`Mismatch` if they are not as many)."""
        extras: dict[str, mx.array] = {}
        if self.by_image and splits(kept, images):
            read = by_image(self.vlm, self.image_token, ids, kept, images)
        elif self.images_alone:

            def read() -> mx.array:
                out, extras_ = with_extras(self.vlm, ids, for_ids(kept, ids, self.image_token))
                extras.update(extras_)
                return out
        else:
            read = lambda: whole(self.vlm, ids, kept)  # noqa: E731

        def step() -> mx.array | tuple[mx.array, Beside | Extras] | None:
            try:
                out = read()
            except Unreadable as exc:
                raise _unsupported(exc) from None
            if out is None:
                return None
            features, carried = out if isinstance(out, tuple) else (out, None)
            if features.shape[0] != length:
                raise Mismatch(
                    f"the model gave {features.shape[0]} input embeddings for a prompt of {length} tokens: onelane "
                    "cannot read this prompt with its images"
                )
            self.images_read += images
            embeds = features[cached:] if self.prefix_lm else features[cached:-1]
            mx.eval(embeds, extras)
            if extras:
                return embeds, beside(extras)
            later = after(carried, cached)
            return (embeds, later) if later is not None else embeds

        return step

    def _keyed(self, ids: list[int], digests: tuple[str, ...], arrays: Arrays | None = None) -> list[int]:
        """The ids with each image's tokens named by the image (ids past the vocabulary, from its digest: two 28-bit
        pieces in turn): the image tokens in order, split evenly among the images (each image is as many tokens).
        Tags that other images' prompts hold already (alike in those 56 bits) are drawn again from a salted digest:
        the tags find the prompt's images' full digests here (their arrays, and the marks the prefix cache checks).
        A model whose features go where its processor says (Molmo, MiniCPM-V: `arrays`, the processor's for these
        ids) has their span, from the first place to the last, named as an expanding model's is."""
        placed = placed_at(arrays, len(ids)) if arrays is not None else None
        if placed:
            self.placed = True
            if len(digests) > 1 and arrays is not None and PLACES in arrays:  # (mlx-vlm's Molmo and Jina VLM fail
                raise InvalidPrompt("the model reads one image a prompt")  # on a second: its places overrun)
            return self._expanded(ids, digests, span_at(ids, placed))
        if self.expands:
            return self._expanded(ids, digests)
        at = [i for i, t in enumerate(ids) if t == self.image_token]
        if not at or len(at) % len(digests):
            raise InvalidPrompt("the model's processor wrote the images' tokens in a way onelane cannot follow")
        each = len(at) // len(digests)
        keyed = list(ids)
        for salt in range(64):
            named = [d if not salt else hashlib.sha256(f"{salt}:{d}".encode()).hexdigest() for d in digests]
            for n, i in enumerate(at):
                digest, k = named[n // each], n % each
                keyed[i] = self.tags + int(digest[7 * (k % 2) : 7 * (k % 2) + 7], 16)
            tags = _images(keyed, self.tags)
            if self._digests.setdefault(tags, digests) == digests:
                break
        else:  # (64 collisions of 56 bits in a row: never, unless SHA-256 is broken)
            raise InvalidPrompt("an image of the request cannot be told apart from another the worker holds")
        self._kept(tags)
        return keyed

    def _expanded(self, ids: list[int], digests: tuple[str, ...], span: Span | None = None) -> list[int]:
        """An expanding model's keyed prompt (worker/vision_reading.py): as many positions as its embeddings, the
        number read from the shape of mlx-vlm's computation over the images' prepared arrays, once; or, given the
        `span` of the images' features, that span named."""
        if span is None:
            span = span_of(ids, self.image_token, self._length(ids, digests))
        for salt in range(64):
            keyed = expanded(ids, span, self.tags, digests, salt)
            tags = _images(keyed, self.tags)
            if self._digests.setdefault(tags, digests) == digests and self._spans.setdefault(tags, span) == span:
                break
        else:  # (64 collisions of 56 bits in a row: never, unless SHA-256 is broken)
            raise InvalidPrompt("an image of the request cannot be told apart from another the worker holds")
        self._kept(tags)
        return keyed

    def _length(self, ids: list[int], digests: tuple[str, ...]) -> int:
        """How many embeddings an expanding model gives for the ids and these images (measured once)."""
        known = (digests, tuple(ids))
        if known not in self._lengths:
            arrays = self.prep.arrays(digests)
            if arrays is None:
                raise InvalidPrompt("the prompt's images are no longer held by the worker: send the request again")
            self._lengths[known] = embeddings_length(self.vlm, ids, arrays)
        self._lengths.move_to_end(known)
        while len(self._lengths) > KEPT * 16:
            self._lengths.popitem(last=False)
        return self._lengths[known]

    def _kept(self, tags: tuple[int, ...]) -> None:
        """The prompt of these tags was keyed last: the oldest others are forgotten."""
        self._digests.move_to_end(tags)
        if tags in self._spans:
            self._spans.move_to_end(tags)
        while len(self._digests) > KEPT * 16:
            gone, _ = self._digests.popitem(last=False)
            self._spans.pop(gone, None)


def _unsupported(exc: Unreadable) -> VisionUnsupported:
    return VisionUnsupported(
        f"its images come with {exc} beside their embeddings (inputs that depend on the image, which onelane's "
        "batch does not carry yet): it does not read such a model's images"
    )


def _asking(name: str, images: dict[str, bytes]) -> JobSpec:
    """A question about these images (the probe's)."""
    pictures = tuple(Picture(digest=d, at=0) for d in images)
    return JobSpec(owner="", model=name, messages=(Message(role="user", content="?", images=pictures),))


def _last_image(keyed: list[int], vocab: int) -> int:
    """Where a keyed prompt's last image token is."""
    return max(i for i, t in enumerate(keyed) if t >= vocab)


def _images(keyed: list[int], vocab: int) -> tuple[int, ...]:
    """A keyed prompt's images' ids, in order (what its kept inputs are found by)."""
    return tuple(t for t in keyed if t >= vocab)


def _content(parts: list[tuple[str, str]], words: str | None) -> list[dict[str, str]]:
    """A message's content as a processor's chat template reads it: its images as image parts, in place (its words
    whole after them where the turn's text was rewritten, a speaker's name before it say)."""
    images = [{"type": "image"} for kind, _ in parts if kind == "image"]
    if words is not None:
        return [*images, {"type": "text", "text": words, "content": words}]
    return [
        {"type": "image"} if kind == "image" else {"type": "text", "text": value, "content": value}
        for kind, value in parts
    ]


def _image(data: bytes) -> Any:
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    image.seek(0)  # an animated image: its first frame
    return image.convert("RGB")


def _image_token(vlm: nn.Module) -> int:
    """The token whose places the image features take, as the model's config names it, or the config its language
    model was built with (Qwen3-Omni's thinker's: its config nests the thinker's) (Molmo 2's `image_patch_id`, whose
    features are added to its <im_patch> embeddings; GOT-OCR's `im_patch_token`); -1 (no token: never a prompt's)
    where none names it, as a model whose features go where its processor says (Molmo, Jina VLM) need not."""
    for config in (vlm.config, getattr(vlm.language_model, "config", None)):
        for name in ("image_token_index", "image_token_id", "image_patch_id", "im_patch_token"):
            value = getattr(config, name, None)
            if isinstance(value, int):
                return value
    return -1


def _first_tag(vocab: int, processor: Any) -> int:
    """The first id of the images' tags: past the vocabulary the model scores, and past every id its tokenizer
    gives (Molmo's and Jina VLM's image tokens are ids of an additional vocabulary it reads but never draws; a
    tokenizer's added ids need not follow its others: its largest, not its length)."""
    tokenizer = getattr(processor, "tokenizer", processor)
    ids = tokenizer.get_vocab().values() if hasattr(tokenizer, "get_vocab") else ()
    return max([vocab, *(int(i) + 1 for i in ids)])


def _eos(config: Any, processor: Any) -> list[int] | None:
    text = getattr(config, "text_config", None)
    for source in (config, text):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            return [value]
        if isinstance(value, list) and value:
            return [int(v) for v in value]
    return None


def _folder_of(path: str) -> Path:
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(path, local_files_only=True))
