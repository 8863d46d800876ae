"""Vision models whose images are not one embedding per prompt id, or whose prompt mlx-vlm renders its own way
(issue 61): each answer is mlx-vlm's own (`mlx_vlm.stream_generate`, greedy, that prompt alone), token for token,
while three image prompts of different lengths and a text prompt run at once in one VisionEngine batch.

- `llava_next` expands: its `get_input_embeddings` gives more embeddings than its prompt's ids. Before, the batch
  took one embedding per id and answered from another sequence; its keyed prompt now holds as many positions as its
  embeddings (worker/vision_reading.py), and a prompt whose embeddings cannot line up with its tokens fails alone,
  as an invalid prompt.
- `paligemma` reads its prefix (the image, BOS, the question) with bidirectional attention, in one pass in mlx-vlm:
  the batch reads its image prompt so too (it read it causally in chunks before), then decodes it as any other.
- `mllama` (Llama 3.2 Vision) reads its image through cross-attention: its states (and, for the prompt, its
  masks) go to every forward pass, the decode steps too. It was refused at load; its image jobs now run alone in
  the lane (the batch drains, the job runs, the batch resumes), their inputs passed at every step.
- `hunyuan_vl` (HunYuan VL) places its image tokens (XD-RoPE) only in a cache's first pass, by positions its
  `get_input_embeddings` keeps on its language model: its image prompt is read whole, as mlx-vlm reads it (it was
  read in chunks, each image token past the first chunk rotated by its index), and a text prompt after it no longer
  reads the last image prompt's positions.
- `internvl_chat` is rendered with its processor's own template (`User: …`, `Assistant:`), as mlx-vlm renders it,
  not its tokenizer's (ChatML), a conversation without images too.
- A conversation without images is rendered and tokenized as mlx-vlm does (its BOS was missing before).

On the code before (943be52) the first test fails for each: llava_next and paligemma fail to load (the probe's two
images: `[broadcast_shapes]`, and PaliGemma's processor takes one image a prompt), mllama is refused at load
(cross_attention_states …), internvl_chat answers all four prompts otherwise than mlx-vlm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tasks.errors import InvalidPrompt
from tests.vision_batch import ASKS, TEXT, Ask, load, png, reference, together
from tests.vlms.hunyuan import ARCHS as HUNYUAN
from tests.vlms.internvl import ARCHS as INTERNVL
from tests.vlms.llava import ARCHS as LLAVA
from tests.vlms.mllama import ARCHS as MLLAMA
from tests.vlms.paligemma import ARCHS as PALIGEMMA
from worker.vision_reading import Mismatch, span_of

pytestmark = pytest.mark.timeout(300)

MAX_TOKENS = 10
ARCHS = {**LLAVA, **PALIGEMMA, **INTERNVL, **MLLAMA, **HUNYUAN}
IMAGES_ONLY = {"paligemma"}  # (its processor refuses a prompt without an image: mlx-vlm has no text answer)
# mlx-vlm's Llama 3.2 Vision reads a prompt without an image through its cross-attention layers too, on keys made of
# the chunk's own queries: its answer depends on how the prompt is chunked (mlx-vlm reads 2,048 tokens a chunk), so
# it is compared read in one chunk (the worker reads ONELANE_PREFILL_STEP tokens a chunk when nothing else runs)
TEXT_WHOLE = {"mllama"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("alone")
    for arch, build in ARCHS.items():
        build(root / arch)
    return {arch: root / arch for arch in ARCHS}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_three_image_prompts_and_a_text_prompt_at_once_answer_as_mlx_vlm_alone(arch: str, folders: Any) -> None:
    import mlx_vlm

    # Given the model served by onelane, and mlx-vlm's own load of the same folder
    engine = load(folders[arch], arch, max_batch=4)
    vlm, processor = mlx_vlm.load(str(folders[arch]))
    asks = [*ASKS] if arch in IMAGES_ONLY | TEXT_WHOLE else [*ASKS, TEXT]
    # When three image questions of different lengths and a text one are inserted together into one batch
    got = together(engine, asks, MAX_TOKENS)
    # Then each answer is mlx-vlm's for that prompt alone
    expected = [reference(vlm, processor, ask, MAX_TOKENS) for ask in asks]
    assert got == expected
    if arch in TEXT_WHOLE:
        engine.configure(4, 512)
        assert together(engine, [TEXT], MAX_TOKENS) == [reference(vlm, processor, TEXT, MAX_TOKENS)]
    # (and the model reads its image: the same question about another image is answered otherwise)
    other = Ask(ASKS[0].text, png("blue"))
    assert reference(vlm, processor, other, MAX_TOKENS) != expected[0]


def test_an_expanding_model_keys_as_many_positions_as_its_embeddings(folders: Any) -> None:
    from tests.vision_batch import spec

    engine = load(folders["llava_next"], "llava_next")
    assert engine.expands and not engine.by_image
    job, images = spec("llava_next", ASKS[0], 4)
    prompt = engine.prompt_tokens(job, images)
    embeds, ids = engine.embeddings(prompt, 0)
    assert embeds is not None and ids is not None
    while (read := embeds()) is None:
        pass
    # every position of the keyed prompt but its last has its embedding (the last is read as the first decode row)
    assert read.shape[0] == len(ids) - 1 == len(prompt) - 1
    # a prompt measured again keys the same (the prefix cache finds it), and the marks find its image
    assert engine.prompt_tokens(job, images) == prompt
    assert [d for _, d in engine.marks(prompt)] == list(images)


def test_embeddings_that_cannot_line_up_with_the_prompt_fail_its_job_as_an_invalid_prompt() -> None:
    # a prompt of 3 text tokens, 4 image tokens and 2 text tokens, whose model would give 4 embeddings in all
    ids = [5, 6, 7, 99, 99, 99, 99, 8, 9]
    assert span_of(ids, 99, 12).length == 7  # (12 embeddings: the 4 image tokens stand as 7 positions)
    with pytest.raises(Mismatch, match="do not line up with its 9 tokens") as failed:
        span_of(ids, 99, 4)
    assert isinstance(failed.value, InvalidPrompt) and failed.value.type == "invalid_prompt"
    with pytest.raises(Mismatch, match="no image token"):
        span_of([5, 6], 99, 2)


@pytest.mark.parametrize("arch", ["paligemma", "hunyuan_vl"])
def test_a_model_read_whole_reads_its_image_prompt_so_and_shares_no_cached_part_of_it(arch: str, folders: Any) -> None:
    from tests.vision_batch import spec

    engine = load(folders[arch], arch)
    assert engine.images == "whole" and engine._batch.whole_prompts
    assert engine.prefix_lm == (arch == "paligemma")
    job, images = spec(arch, ASKS[0], 4)
    prompt = engine.prompt_tokens(job, images)
    # its image's mark, and one at its start that no other prompt's matches (its state depends on its whole prefix)
    first, again = engine.marks(prompt), engine.marks(prompt)
    assert first[1:] == again[1:] and first[1][1] in images
    assert first[0][0] == 0 and first[0] != again[0]


def test_a_cross_attention_models_image_jobs_run_alone_and_say_so(folders: Any) -> None:
    from tests.vision_batch import spec

    engine = load(folders["mllama"], "mllama", max_batch=4)
    assert (engine.images, engine.images_alone, engine.by_image) == ("alone", True, False)
    prompts = []
    for ask in [ASKS[0], TEXT, ASKS[1]]:
        job, images = spec("mllama", ask, 3)
        prompts.append(engine.prompt_tokens(job, images))
        engine.insert(prompts[-1], job.params)
    assert [engine.runs_alone(p) for p in prompts] == [True, False, True]
    # whatever else is in the batch, a sequence alone decodes with nothing beside it
    batch = engine._batch
    while engine.size:
        engine.step()
        assert not any(r.alone for r in batch._rows) or len(batch._rows) == 1


def test_a_cross_attention_models_image_prompt_read_from_its_cache_still_sees_its_image(folders: Any) -> None:
    from mlx_lm.models.cache import trim_prompt_cache

    from tests.vision_batch import spec

    engine = load(folders["mllama"], "mllama")
    job, images = spec("mllama", ASKS[2], 6)
    prompt = engine.prompt_tokens(job, images)

    def answer(cache: Any = None, cached: int = 0) -> tuple[list[int], Any]:
        uid, out, kv = engine.insert(prompt, job.params, cache=cache, cached=cached), [], None
        while engine.size:
            for token in engine.step():
                assert token.uid == uid
                out.append(token.token)
                kv = token.kv or kv
        return out, kv

    # Given its answer read whole, and the KV state it leaves (its prompt and answer, but the last token)
    first, kv = answer()
    assert kv is not None
    # When it is asked again from that state, cut to all of its prompt but the last token (a prefix-cache hit)
    trim_prompt_cache(kv.cache, len(kv.tokens) - (len(prompt) - 1))
    again, _ = answer(kv.cache, len(prompt) - 1)
    # Then its image is read again for the steps that need it: the same answer
    assert again == first


def test_a_sequence_alone_waits_for_the_batch_to_drain_and_none_joins_it_until_it_leaves(folders: Any) -> None:
    from tasks.job import SamplingParams
    from tests.vision_batch import spec
    from worker.batch.forward import ContinuousBatch
    from worker.batch.rows import Beside
    from worker.batch.sampling import make_sampler

    # Given a model whose sequences batch, an image prompt marked to run alone, and text prompts around it
    engine = load(folders["llava_next"], "llava_next")
    assert engine.batching != "alone"
    prompts = {}
    for name, ask in {"before": TEXT, "beside": Ask("Hi"), "image": ASKS[1], "after": Ask("And then?")}.items():
        job, images = spec("llava_next", ask, 6)
        prompts[name] = engine.prompt_tokens(job, images)

    def run(names: list[str]) -> tuple[dict[str, list[int]], list[list[str]]]:
        batch = ContinuousBatch(engine.model, 8, 4, None, engine.batching)
        uids = {}
        for name in names:
            embeds, ids = engine.embeddings(prompts[name], 0)
            alone = embeds is not None
            if embeds is not None:
                reading = embeds
                embeds = lambda: (lambda out: out if out is None else (out, Beside({}, {})))(reading())  # noqa: E731
            sampler = make_sampler(SamplingParams(temperature=0.0))
            uids[batch.insert(prompts[name], 6, sampler, embeds=embeds, ids=ids, alone=alone)] = name
        out: dict[str, list[int]] = {name: [] for name in names}
        decoding = []
        while len(batch):
            for emitted in batch.step():
                out[uids[emitted.uid]].append(emitted.token)
            decoding.append([uids[r.uid] for r in batch._rows])
        return out, decoding

    # When they are inserted in this order into one batch
    together, decoding = run(["before", "beside", "image", "after"])
    # Then the image prompt decodes with nothing beside it: after the two before it left, before the one after joins
    steps = [i for i, rows in enumerate(decoding) if "image" in rows]
    assert steps and all(decoding[i] == ["image"] for i in steps)
    assert not any({"before", "beside"} & set(rows) for rows in decoding[steps[0] :])
    assert not any("after" in rows for rows in decoding[: steps[-1] + 1])
    # And each answer is its answer alone
    assert together == {name: run([name])[0][name] for name in prompts}
