"""Models whose positions depend on their images (M-RoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL and its MoE, Qwen 3.5,
GLM-4V), served in the batch (issue 61): each row carries its own positions (worker/batch/positions.py) and Qwen3-VL
its deepstack features (worker/vision_beside.py), so three image prompts of different lengths (other images, other
grids, other rope deltas) read and decoded together beside a text prompt each answer as `mlx_vlm.generate` answers
it alone; and so do a follow-up read from the prefix cache (no pixels read), a job resumed from its tokens, the
second choice of `n` (the first's prompt cache copied) and a row preempted and put back.

On main these models are refused at load ("its images come with position_ids, rope_deltas ... beside their
embeddings") and GLM-4V's rows are rotated by the last prompt's positions: every test here fails there. The prompts
are read in chunks of CHUNK tokens, so that an image's tokens are cut across chunks (each chunk takes its slice of
the positions and of the deepstack features).
"""

from __future__ import annotations

import hashlib
import io
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tasks.catalogue import ModelConfig
from tasks.job import JobSpec, Message, Picture, SamplingParams
from tests.vlms.glm import ARCHS as GLM
from tests.vlms.qwen import ARCHS as QWEN

pytestmark = pytest.mark.timeout(600)

ARCHS: dict[str, Callable[[Path], None]] = {**QWEN, **GLM}
MAX_TOKENS = 12
CHUNK = 5  # prompt tokens a step reads: an image's tokens are cut across chunks
#: (size, colour, question): grids of 2x2, 3x4 and 4x4 tokens, rope deltas -2, -8 and -12
IMAGES = [
    ((56, 56), "red", "What is this?"),
    ((112, 84), "blue", "Describe the picture in a few words, please."),
    ((112, 112), "green", "Colour?"),
]
STORY = "Tell me a story about a cat."


def png(size: tuple[int, int], colour: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "PNG")
    return out.getvalue()


@dataclass
class Served:
    """A tiny model's folder, onelane's engine on it, and mlx-vlm's own model and processor (the reference)."""

    folder: Path
    engine: Any
    vlm: Any
    processor: Any

    def reference(self, messages: list[dict[str, Any]], images: list[bytes]) -> list[int]:
        """mlx-vlm's greedy tokens for these messages and images, alone (up to its EOS), rendered as its generate and
        server render a chat (`apply_chat_template`)."""
        import mlx_vlm
        from mlx_vlm.prompt_utils import apply_chat_template

        prompt = apply_chat_template(self.processor, self.vlm.config, messages, num_images=len(images))
        files = []
        for n, data in enumerate(images):
            (path := self.folder / f"image-{hashlib.sha256(data).hexdigest()[:12]}-{n}.png").write_bytes(data)
            files.append(str(path))
        out = mlx_vlm.generate(
            self.vlm, self.processor, prompt, image=files or None, max_tokens=MAX_TOKENS, temperature=0.0
        )
        return [t for t in out.token_ids if t not in self.engine.eos]

    def prompt(self, messages: tuple[Message, ...], images: dict[str, bytes]) -> list[int]:
        return list(self.engine.prompt_tokens(JobSpec(owner="", model="m", messages=messages), images))


@pytest.fixture(scope="module", params=sorted(ARCHS))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    import mlx_vlm

    from worker.vision import VisionEngine

    folder = tmp_path_factory.mktemp(request.param)
    ARCHS[request.param](folder)
    engine = VisionEngine.load(ModelConfig(name="m", path=str(folder), vision=True), max_batch=4)
    engine.configure(4, CHUNK)
    vlm, processor = mlx_vlm.load(str(folder))
    yield Served(folder, engine, vlm, processor)
    engine.close()


def asked(question: str, digest: str | None) -> Message:
    pictures = (Picture(digest=digest, at=0),) if digest else ()
    return Message(role="user", content=question, images=pictures)


def hub(question: str, image: bool) -> dict[str, Any]:
    """The same turn as mlx-vlm's callers write it."""
    if not image:
        return {"role": "user", "content": question}
    return {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}


class Stepped:
    """The batch stepped by a test: every sequence's tokens so far (EOS left out), which ended, their KV states."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.tokens: defaultdict[int, list[int]] = defaultdict(list)
        self.done: set[int] = set()
        self.kept: dict[int, Any] = {}

    def until(self, ready: Callable[[], bool]) -> None:
        with self.engine.lock:
            while not ready():
                for t in self.engine.step():
                    if t.token not in self.engine.eos:
                        self.tokens[t.uid].append(t.token)
                    if t.finish_reason:
                        self.done.add(t.uid)
                        self.kept[t.uid] = t.kv

    def finish(self, uids: list[int]) -> dict[int, list[int]]:
        """Step until these sequences end; their tokens."""
        self.until(lambda: set(uids) <= self.done)
        return {uid: self.tokens[uid] for uid in uids}


def run(engine: Any, uids: list[int], kept: dict[int, Any] | None = None) -> dict[int, list[int]]:
    """Step the batch until these sequences end: each one's tokens (its EOS left out); `kept`: their KV states."""
    stepped = Stepped(engine)
    tokens = stepped.finish(uids)
    if kept is not None:
        kept.update(stepped.kept)
    return tokens


def inserted(served: Served) -> tuple[list[int], list[list[int]], dict[str, bytes]]:
    """The three image prompts and the text one, inserted together; their uids, the references, the images."""
    images = {hashlib.sha256(data).hexdigest(): data for data in (png(size, c) for size, c, _ in IMAGES)}
    uids, expected = [], []
    for (_, _, question), (digest, data) in zip(IMAGES, images.items()):
        prompt = served.prompt((asked(question, digest),), {digest: data})
        uids.append(served.engine.insert(prompt, SamplingParams(max_tokens=MAX_TOKENS)))
        expected.append(served.reference([hub(question, True)], [data]))
    uids.append(served.engine.insert(served.prompt((asked(STORY, None),), {}), SamplingParams(max_tokens=MAX_TOKENS)))
    expected.append(served.reference([hub(STORY, False)], []))
    return uids, expected, images


def test_three_image_prompts_beside_a_text_one_answer_as_mlx_vlm_alone(served: Served) -> None:
    # Given three image prompts of different lengths and grids, and a text prompt, in the batch at once
    uids, expected, _ = inserted(served)

    # When they are read (in chunks) and decoded together
    answers = run(served.engine, uids)

    # Then each answer is mlx-vlm's for its prompt alone
    assert [answers[u] for u in uids] == expected


def test_a_follow_up_read_from_the_prefix_cache_answers_as_mlx_vlm(served: Served) -> None:
    from mlx_lm.models.cache import can_trim_prompt_cache

    from worker.prefix_cache import PrefixCache

    # Given a first answer about an image, its KV state kept in the prefix cache
    engine, key = served.engine, ("m", "")
    size, colour, question = IMAGES[1]
    data = png(size, colour)
    digest = hashlib.sha256(data).hexdigest()
    first = served.prompt((asked(question, digest),), {digest: data})
    kept: dict[int, Any] = {}
    uid_first = engine.insert(first, SamplingParams(max_tokens=MAX_TOKENS))
    answer = run(engine, [uid_first], kept)[uid_first]
    cache = PrefixCache(1 << 30)
    cache.insert(key, kept[uid_first].tokens, kept[uid_first].cache, engine.marks(kept[uid_first].tokens))
    words = engine.tokenizer.decode(answer)

    # When a follow-up about the same image comes, its images' arrays gone (a worker that prepared many since)
    engine.prep._arrays.clear()
    asked_before = engine.prep.asked
    messages = (asked(question, digest), Message(role="assistant", content=words), asked("And then?", None))
    spec = JobSpec(owner="", model="m", messages=messages)
    reach: Callable[[list[int]], int] = lambda keyed: cache.reach(key, keyed, engine.marks(keyed))  # noqa: E731
    prompt = engine.prompt_tokens(spec, {digest: data}, reach=reach)
    hit = cache.fetch(key, prompt, engine.marks(prompt))
    read = engine.images_read
    uid = engine.insert(prompt, SamplingParams(max_tokens=MAX_TOKENS), hit.cache, hit.tokens)
    follow_up = run(engine, [uid])[uid]

    # Then it read its prefix from the cache, no pixels (where a cached sequence can be cut back to a prompt's
    # part: Qwen 3.5's linear layers' state cannot, so its entry serves only prompts it is all a prefix of), and
    # answers as mlx-vlm does from the whole conversation
    if can_trim_prompt_cache(kept[uid_first].cache):
        assert hit.tokens > max(i for i, t in enumerate(prompt) if t >= engine.vocab)
        assert engine.images_read == read
        assert engine.prep.asked == asked_before  # (nor did the image preparer decode it)
    turns = [hub(question, True), {"role": "assistant", "content": words}, hub("And then?", False)]
    assert follow_up == served.reference(turns, [data])


def test_a_resumed_sequence_goes_on_as_mlx_vlm(served: Served) -> None:
    # Given a job about an image that had generated some tokens when its worker died
    size, colour, question = IMAGES[2]
    data = png(size, colour)
    digest = hashlib.sha256(data).hexdigest()
    expected = served.reference([hub(question, True)], [data])
    done = tuple(expected[:5])

    # When it is read again from its prompt and those tokens
    prompt = served.prompt((asked(question, digest),), {digest: data})
    uid = served.engine.insert(prompt, SamplingParams(max_tokens=MAX_TOKENS), generated=done)

    # Then it goes on as mlx-vlm's answer does
    assert [*done, *run(served.engine, [uid])[uid]] == expected


def test_the_second_choice_from_the_first_ones_prompt_cache_answers_as_mlx_vlm(served: Served) -> None:
    # Given an image prompt whose first choice has read it (beside the other prompts)
    engine = served.engine
    uids, expected, images = inserted(served)
    digest, data = next(iter(images.items()))
    prompt = served.prompt((asked(IMAGES[0][2], digest),), {digest: data})
    stepped = Stepped(engine)
    stepped.until(lambda: bool(stepped.tokens[uids[0]]))

    # When the second choice joins from a copy of its prompt's cache (worker/runner/choices.py)
    cache = engine.extract(uids[0], len(prompt) - 1)  # (None where it cannot be cut: Qwen 3.5's linear layers')
    cached = len(prompt) - 1 if cache is not None else 0
    second = engine.insert(prompt, SamplingParams(max_tokens=MAX_TOKENS), cache, cached)
    answers = stepped.finish([*uids, second])

    # Then both choices, and the others, answer as mlx-vlm alone
    assert [answers[u] for u in uids] == expected
    assert answers[second] == expected[0]


def test_a_row_preempted_and_put_back_goes_on_as_mlx_vlm(served: Served) -> None:
    from worker.prefix_cache import PrefixCache

    # Given the batch of four, decoding
    engine = served.engine
    uids, expected, _ = inserted(served)
    stepped = Stepped(engine)
    stepped.until(lambda: len(stepped.tokens[uids[1]]) >= 3)

    # When an image row is taken out, its KV state kept in the prefix cache, and put back from there, its tokens so
    # far read as prompt (worker/runner/preemption.py)
    kv = engine.remove([uids[1]], keep=True)[uids[1]]
    cache = PrefixCache(1 << 30)
    cache.insert(("m", ""), kv.tokens, kv.cache, engine.marks(kv.tokens))
    hit = cache.fetch(("m", ""), kv.tokens, engine.marks(kv.tokens))
    length = len(kv.tokens) - len(stepped.tokens[uids[1]])  # its prompt's (its KV state holds the tokens emitted)
    prompt, generated = kv.tokens[:length], tuple(kv.tokens[length:])
    back = engine.insert(prompt, SamplingParams(max_tokens=MAX_TOKENS), hit.cache, hit.tokens, generated)
    answers = stepped.finish([uids[0], uids[2], uids[3], back])

    # Then every answer is still mlx-vlm's
    assert [*generated, *answers[back]] == expected[1]
    assert [answers[u] for u in (uids[0], uids[2], uids[3])] == [expected[0], expected[2], expected[3]]


def test_two_images_of_different_sizes_are_read_one_a_step_where_the_model_allows(served: Served) -> None:
    from worker.vision_tower import by_image, whole

    # Given a prompt of two images of different grids (their patches flattened into one array, each its grid)
    engine = served.engine
    datas = [png(size, colour) for size, colour, _ in IMAGES[:2]]
    digests = [hashlib.sha256(d).hexdigest() for d in datas]
    message = Message(role="user", content="Both?", images=tuple(Picture(digest=d, at=0) for d in digests))
    ids, kept, count = engine._inputs(served.prompt((message,), dict(zip(digests, datas))))

    # Then a model whose images are read apart from each other (no deepstack features beside them) reads them one
    # image a step, a part of the pass each, and the embeddings are the whole call's
    arch = served.folder.name[:-1]  # (tmp_path_factory numbers the folder it makes)
    assert engine.by_image == (arch not in ("qwen3_vl", "qwen3_vl_moe")), arch
    if engine.by_image:
        reading = by_image(engine.vlm, engine.image_token, ids, kept, count)
        assert reading() is None and reading() is None
        alone = reading()
        together = whole(engine.vlm, ids, kept)
        assert not isinstance(alone, tuple | None) and not isinstance(together, tuple)
        assert alone.shape == together.shape and np.allclose(alone, together, atol=1e-4, rtol=1e-3)
