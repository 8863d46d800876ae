"""An image's identity (issue 60, items 6 and 16): the prefix cache tells images apart by their whole SHA-256, not
the 56 bits their tokens carry, in RAM and on disk; and an image is read as mlx-vlm's own loader reads it (EXIF
orientation applied), so a sideways photo is answered as `mlx_vlm.generate` answers it from the file."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import pytest
import requests
from PIL import Image

from tasks.settings import Settings
from tests.helpers import finished
from tests.test_hostile_models import serve
from tests.tiny_vision import build_gemma3

pytestmark = pytest.mark.timeout(300)

KEY = ("model", "owner")
AT = 20  # where the story's "image" starts in the prompt (past the least hit)
ONE = "5f3c" * 16
TWIN = ONE[:14] + "0" * 50  # the same first 56 bits (its tokens' tags), another image


def test_two_images_alike_in_their_first_56_bits_share_no_cached_state(engine, tmp_path):
    from worker.prefix_cache import PrefixCache
    from worker.prefix_disk import DiskTier

    # Given a sequence kept with an image at AT (RAM and disk)
    disk = DiskTier(tmp_path, 1 << 34, 1 << 34)
    disk.serve(KEY[0], "w")
    disk.start()
    cache = PrefixCache(1 << 30, disk)
    _, kv = finished(engine, "prompt number 0: " + "words " * 60)
    cache.insert(KEY, kv.tokens, kv.cache, ((AT, ONE),))
    disk.flush()
    follow_up = [*kv.tokens, 7, 8]

    # When prompts of the same tokens ask for it, one with that image, one with its twin
    same = cache.fetch(KEY, follow_up, ((AT, ONE),))
    twin = cache.fetch(KEY, follow_up, ((AT, TWIN),))

    # Then the same image reads it whole, the twin only what comes before its image
    assert (same.tokens, twin.tokens) == (len(kv.tokens), AT)
    assert cache.reach(KEY, follow_up, ((AT, TWIN),)) == AT

    # And a worker that reads it from disk tells them apart too
    fresh = DiskTier(tmp_path, 1 << 34, 1 << 34)
    fresh.serve(KEY[0], "w")
    fresh.start()
    from_disk = PrefixCache(1 << 30, fresh)
    assert from_disk.fetch(KEY, follow_up, ((AT, TWIN),)).tokens == AT
    assert from_disk.fetch(KEY, follow_up, ((AT, ONE),)).tokens == len(kv.tokens)


def sideways(orientation: int) -> bytes:
    """A JPEG of a red and a blue half, its EXIF saying it was taken turned (6: 90° clockwise, 8: anticlockwise)."""
    image = Image.new("RGB", (48, 32), "red")
    image.paste(Image.new("RGB", (24, 32), "blue"), (24, 0))
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    image.save(out, "JPEG", quality=95, exif=exif)
    return out.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_gemma3(tmp_path_factory.mktemp("vision") / "gemma")


@pytest.fixture
def settings(settings: Settings, folder: Path, tmp_path: Path) -> Settings:
    return serve(settings.model_copy(update={"max_batch": 2}), tmp_path, gemma={"path": str(folder)})[0]


def mlx_vlm_answer(folder: Path, image: Any, max_tokens: int) -> list[int]:
    """mlx-vlm's own greedy answer about `image` (a file's path: its own loader reads it), as token ids."""
    import mlx_vlm

    vlm, processor = mlx_vlm.load(str(folder))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    prompt = processor.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    out = mlx_vlm.generate(vlm, processor, prompt, image=[image], max_tokens=max_tokens, temperature=0.0)
    return list(out.token_ids)


@pytest.mark.parametrize("orientation", [6, 8])
def test_a_sideways_photo_is_answered_as_mlx_vlm_answers_it_from_the_file(
    orientation, start_worker, settings, live_server, folder, tmp_path
):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    # Given a photo taken sideways, as a file
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(sideways(orientation))
    start_worker(settings)

    # When onelane is asked about it
    url = f"data:image/jpeg;base64,{base64.b64encode(photo.read_bytes()).decode()}"
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is this?"}]
    body = {"model": "gemma", "messages": [{"role": "user", "content": content}], "max_tokens": 12}
    reply = requests.post(f"{live_server}/v1/chat/completions", json=body | {"temperature": 0}, timeout=120)
    assert reply.status_code == 200, reply.text

    # Then its answer is mlx-vlm's from the file's path (its load_image turns it upright) ...
    ids = mlx_vlm_answer(folder, str(photo), 12)
    detokenizer = load_tokenizer(folder).detokenizer
    detokenizer.reset()
    for token in ids:
        if token in (2, 2049):  # (the tiny Gemma 3's EOS ids)
            break
        detokenizer.add_token(token)
    detokenizer.finalize()
    assert reply.json()["choices"][0]["message"]["content"] == detokenizer.text
    # ... which is not its answer about the photo as stored, unturned: the turn made a difference
    unturned = Image.open(io.BytesIO(photo.read_bytes())).convert("RGB")
    assert mlx_vlm_answer(folder, unturned, 12) != ids


@pytest.mark.parametrize("orientation", [6, 8])
def test_the_worker_reads_a_sideways_photo_as_mlx_vlms_loader_does(orientation, folder, tmp_path):
    """The worker's own reading (a photo whose bytes kept their EXIF: one sent before the door turned photos, a
    batch's, a response's), not the door's: its greedy tokens are mlx-vlm's from the file."""
    from tasks.catalogue import ModelConfig
    from tasks.job import JobSpec, Message, Picture, SamplingParams
    from worker.vision import VisionEngine

    photo = tmp_path / "photo.jpg"
    photo.write_bytes(sideways(orientation))
    engine = VisionEngine.load(ModelConfig(name="gemma", path=str(folder), vision=True))
    picture = Picture(digest="e" * 64, at=0)
    spec = JobSpec(
        owner="", model="gemma", messages=(Message(role="user", content="What is this?", images=(picture,)),)
    )
    uid = engine.insert(engine.prompt_tokens(spec, {picture.digest: photo.read_bytes()}), SamplingParams(max_tokens=12))
    tokens: list[int] = []
    with engine.lock:
        while not tokens or tokens[-1] >= 0:
            emitted = [e for e in engine.step() if e.uid == uid]
            tokens += [e.token for e in emitted] + [-1 for e in emitted if e.finish_reason]
    assert tokens[:-1] == mlx_vlm_answer(folder, str(photo), 12)[: len(tokens) - 1]


def test_images_alike_in_their_first_56_bits_get_tags_of_their_own(folder):
    from tasks.catalogue import ModelConfig
    from tasks.job import JobSpec, Message, Picture
    from worker.vision import VisionEngine

    engine = VisionEngine.load(ModelConfig(name="gemma", path=str(folder), vision=True))
    image = sideways(6)

    def prompt(digest: str) -> list[int]:
        picture = Picture(digest=digest, at=0)
        message = Message(role="user", content="What is this?", images=(picture,))
        return engine.prompt_tokens(JobSpec(owner="", model="gemma", messages=(message,)), {digest: image})

    one, twin = prompt(ONE), prompt(TWIN)
    assert one != twin  # the twin's tokens name it apart
    assert [d for _, d in engine.marks(one)] == [ONE] and [d for _, d in engine.marks(twin)] == [TWIN]
    assert prompt(ONE) == one  # and the first keeps its tags (a follow-up finds its cached prefix)
