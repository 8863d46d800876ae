"""A long prompt cannot starve the streams (issue 51): while rows decode, a step that reads prompts beside them is fitted
to the decode floor (ONELANE_DECODE_FLOOR tokens/s: a step of at most 1 / floor s), its chunks shrinking to fit, to
16 tokens at least; every decoding row still gets its token in every step. With nothing decoding, prompts read in
whole chunks of ONELANE_PREFILL_STEP."""

from __future__ import annotations

from typing import Any

from mlx_lm.sample_utils import make_sampler

from worker.batch.forward import ContinuousBatch
from worker.batch.rows import MIN_CHUNK, Batching

greedy = make_sampler(0.0)
STEP = 128
LONG = 1000


def read_long_prompt_beside_a_stream(model, floor: float) -> tuple[int, list[int]]:  # type: ignore[no-untyped-def]
    """Steps until a long prompt, inserted while a stream decodes, makes its first token; the stream's tokens in each
    of those steps."""
    batch = ContinuousBatch(model, STEP, 8, None, decode_floor=floor)
    stream = batch.insert([1, 2, 3], 10_000, greedy)
    while not any(e.uid == stream for e in batch.step()):  # the stream decodes
        pass
    long = batch.insert([(7 * n) % 500 + 1 for n in range(LONG)], 4, greedy)
    per_step = []
    for steps in range(1, 2 * LONG):
        emitted = batch.step()
        per_step.append(sum(e.uid == stream for e in emitted))
        if any(e.uid == long for e in emitted):
            return steps, per_step
    raise AssertionError("the long prompt made no token")


def test_a_long_prompt_read_beside_a_stream_is_cut_to_fit_the_floor_and_the_stream_decodes_every_step(demo_engine):
    # With no floor, the long prompt reads in chunks of the prefill step: a handful of steps
    unbounded, _ = read_long_prompt_beside_a_stream(demo_engine.model, floor=0)
    assert unbounded <= LONG // STEP + 3

    # With a floor no step can meet (1,000 tokens/s: 1 ms), its chunks shrink to the least, 16 tokens, and the
    # stream gets its token in every step the prompt is read
    steps, per_step = read_long_prompt_beside_a_stream(demo_engine.model, floor=1000)
    assert steps >= LONG // MIN_CHUNK - 2 * STEP // MIN_CHUNK
    assert all(n == 1 for n in per_step[:-2]), per_step


def test_with_nothing_decoding_a_prompt_reads_in_whole_chunks_whatever_the_floor(demo_engine):
    batch = ContinuousBatch(demo_engine.model, STEP, 8, None, decode_floor=1000)
    long = batch.insert(list(range(1, LONG + 1)), 1, greedy)
    steps = next(n for n in range(1, 100) if any(e.uid == long for e in batch.step()))
    assert steps <= LONG // STEP + 3


def test_the_workers_engine_keeps_the_configured_floor(settings, start_worker):
    worker = start_worker(decode_floor=2.5)
    engine = worker.models.get(settings.model_name)
    assert engine.decode_floor == 2.5 and engine._batch.decode_floor == 2.5


def test_a_question_beside_a_stream_reads_whole_in_one_step_whatever_the_floor(demo_engine):
    batch = ContinuousBatch(demo_engine.model, STEP, 8, None, decode_floor=1000)
    stream = batch.insert([1, 2, 3], 10_000, greedy)
    while not any(e.uid == stream for e in batch.step()):
        pass
    question = batch.insert(list(range(1, STEP)), 1, greedy)  # a prompt of one chunk
    steps = next(n for n in range(1, 100) if any(e.uid == question for e in batch.step()))
    assert steps <= 3  # read in one step, its last token decoded with the stream's in the next


def answers(model: Any, prompts: list[list[int]], step: int, floor: float, batching: Batching) -> list[list[int]]:
    """Each prompt's 6 greedy tokens, the first decoding before the others join."""
    batch = ContinuousBatch(model, step, 8, None, batching, decode_floor=floor)
    first = batch.insert(prompts[0], 6, greedy)
    out: dict[int, list[int]] = {first: []}
    while not out[first]:
        out[first] += [e.token for e in batch.step()]
    out.update({batch.insert(p, 6, greedy): [] for p in prompts[1:]})
    while any(batch.find(uid) is not None for uid in out):
        for e in batch.step():
            out[e.uid].append(e.token)
    return list(out.values())


def test_a_model_that_reads_two_prompt_tokens_a_step_reads_every_prompt_whole_beside_a_stream(demo_engine):
    # Given a model whose prompts read best a few tokens a step (worker/batch/chunking.py chose 2: it happens to a
    # model timed on a busy machine), and prompts joining while a stream decodes under the floor, whose chunks
    # are fitted in steps of 16 tokens and more
    prompts = [[1, 2], [(5 * n) % 300 + 1 for n in range(18)], [(3 * n) % 400 + 1 for n in range(96)]]
    batchings: tuple[Batching, ...] = ("padded", "unpadded")
    for batching in batchings:
        # Then every prompt is read up to its last token, never past it, and answered as with no floor
        assert answers(demo_engine.model, prompts, 2, 1000, batching) == answers(
            demo_engine.model, prompts, 2, 0, batching
        ), batching
