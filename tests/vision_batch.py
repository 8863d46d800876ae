"""Drive a VisionEngine directly (no worker, no web): image prompts and text prompts inserted at once into its
batch, each answer's tokens; and mlx-vlm's own answer for a prompt alone (`mlx_vlm.generate`, greedy), rendered as
mlx_vlm.generate's callers render it (`mlx_vlm.prompt_utils.apply_chat_template`)."""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from tasks.catalogue import ModelConfig
from tasks.job import JobSpec, Message, Picture, SamplingParams


@dataclass(frozen=True)
class Ask:
    """One prompt: its words and, if any, its image (PNG bytes)."""

    text: str
    image: bytes | None = None


def png(color: Any, size: tuple[int, int] = (64, 48), checker: bool = False) -> bytes:
    image = Image.new("RGB", size, color)
    if checker:
        for x in range(size[0]):
            for y in range(size[1]):
                if (x // 8 + y // 8) % 2:
                    image.putpixel((x, y), (255 - x % 256, 40, y % 256))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


#: three images (a solid colour, a checkerboard, a gradient-ish one) and three questions of different lengths
ASKS = (
    Ask("What is this?", png("red")),
    Ask("Describe the picture in a few words, please, with care.", png("white", (80, 30), checker=True)),
    Ask("Colour?", png((10, 200, 90), (40, 64), checker=True)),
)
TEXT = Ask("Tell me a story about a queue of people waiting for one lane.")


def load(folder: Path, name: str, max_batch: int = 4) -> Any:
    """onelane's VisionEngine of the folder, as the worker loads one (its batching as the worker would choose it)."""
    from worker.batch.sharing import choose
    from worker.vision import VisionEngine

    engine = VisionEngine.load(ModelConfig(name=name, path=str(folder), vision=True), max_batch=max_batch)
    engine.share(choose(engine.model, engine.vocab, engine.max_kv_size, engine.prefill_step).batching)
    engine.configure(max_batch, 16)  # small chunks: prompts read over several steps, side by side
    return engine


def spec(name: str, ask: Ask, max_tokens: int) -> tuple[JobSpec, dict[str, bytes]]:
    images = {hashlib.sha256(ask.image).hexdigest(): ask.image} if ask.image else {}
    pictures = tuple(Picture(digest=d, at=0) for d in images)
    message = Message(role="user", content=ask.text, images=pictures)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return JobSpec(owner="t", model=name, messages=(message,), params=params), images


def together(engine: Any, asks: list[Ask], max_tokens: int) -> list[list[int]]:
    """Every ask inserted at once into the engine's batch; each one's generated tokens (an error: its exception)."""
    uids: dict[int, int] = {}
    for n, ask in enumerate(asks):
        job, images = spec(engine.name, ask, max_tokens)
        uids[engine.insert(engine.prompt_tokens(job, images), job.params)] = n
    out: list[list[int]] = [[] for _ in asks]
    for _ in range(2000):
        if not engine.size:
            break
        for token in engine.step():
            out[uids[token.uid]].append(token.token)
    return out


def reference(vlm: Any, processor: Any, ask: Ask, max_tokens: int) -> list[int]:
    """mlx-vlm's own greedy tokens for the ask alone (its eos ignored: as many tokens as asked), its message (the
    image first, as the client sends it) rendered as mlx-vlm renders messages (`get_chat_template`: the processor's
    own template where it has one, else its tokenizer's)."""
    import mlx_vlm
    from mlx_vlm.prompt_utils import get_chat_template

    images = [Image.open(io.BytesIO(ask.image)).convert("RGB")] if ask.image else []
    content = [*({"type": "image"} for _ in images), {"type": "text", "text": ask.text, "content": ask.text}]
    prompt = get_chat_template(processor, [{"role": "user", "content": content}], True)
    tokens: list[int] = []
    for out in mlx_vlm.stream_generate(vlm, processor, prompt, image=images or None, max_tokens=max_tokens,
                                       temperature=0.0, eos_tokens=[]):  # fmt: skip
        tokens.append(int(out.token))
    return tokens[:max_tokens]
