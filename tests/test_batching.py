"""How a model's sequences share the batch is found as it loads, by trying its batched forward pass against its own
alone (worker/batch/sharing.py): a llama-shaped model batches with padded prompt reads, a state-space model with unpadded
ones, a model whose caches mlx-lm cannot merge or whose batched step fails runs alone; one at a time, in order."""

from __future__ import annotations

import pytest
from mlx_lm.sample_utils import make_sampler

from tests.tiny_archs import build
from worker.batch.forward import ContinuousBatch
from worker.batch.sharing import choose

greedy = make_sampler(0.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from mlx_lm.utils import load_model

    def load(arch: str):  # type: ignore[no-untyped-def]
        return load_model(build(arch, tmp_path_factory.mktemp(arch)))[0]

    return load


def test_a_llama_shaped_model_batches_with_padded_prompt_reads(demo_engine):
    verdict = choose(demo_engine.model, demo_engine.vocab)
    assert verdict.batching == "padded", verdict.why


@pytest.mark.parametrize("arch", ["mamba", "falcon_mamba"])
def test_a_state_space_model_batches_with_prompts_read_unpadded(tiny, arch: str) -> None:
    verdict = choose(tiny(arch), 2048)
    assert verdict.batching == "unpadded", verdict.why
    assert verdict.why.startswith("padded: ") and "nats from its logits alone" in verdict.why


@pytest.mark.parametrize(("arch", "way"), [("mamba", "unpadded"), ("falcon_mamba", "unpadded"), ("afm7", "alone")])
def test_a_model_that_reads_two_prompt_tokens_a_step_is_tried_with_padding_and_side_by_side(tiny, arch, way) -> None:
    # Given a model whose prompts read best 2 tokens a step (worker/batch/chunking.py chooses so on a busy machine),
    # tried with chunks of 2: a Mamba's state is wrong with padding read through it; AFM's layers that reuse the
    # last layer's keys place their queries by the batch's longest row
    model = tiny(arch)
    verdict = choose(model, 2048, chunk=2)
    # Then the trial reads padding beside a real read, and decodes the two side by side: it sees both wrong
    assert verdict.batching == way, verdict.why
    # And so a one-word prompt beside longer ones gets mlx-lm's own answer alone
    from mlx_lm.utils import load_tokenizer

    from tasks.catalogue import SHIPPED_DEMO_MODEL
    from tests.tiny_archs import MAX_TOKENS, PROMPTS, alone

    tokenizer = load_tokenizer(SHIPPED_DEMO_MODEL, eos_token_ids=2)
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    batch = ContinuousBatch(model, 2, 4, None, verdict.batching)
    out: dict[int, list[int]] = {batch.insert(p, MAX_TOKENS, greedy): [] for p in prompts}
    while len(batch):
        for e in batch.step():
            out[e.uid].append(e.token)
    assert [tuple(o) for o in out.values()] == [alone(model, tokenizer, p, MAX_TOKENS).tokens for p in prompts]


def test_a_model_whose_caches_cannot_merge_runs_alone(tiny) -> None:
    verdict = choose(tiny("llama4"), 2048)
    assert (verdict.batching, verdict.why) == ("alone", "mlx-lm cannot merge its caches (ChunkedKVCache)")


def test_a_model_whose_attention_picks_keys_by_an_indexer_runs_alone(tmp_path) -> None:
    from mlx_vlm.utils import load_model

    from tests import vlms
    from worker.vision import TextModel

    # Qwen4-Exp: its indexer picks keys past 20 (its tiny budget); mlx-vlm's batched decode step, its rows of
    # different lengths, attends to every key, so two batched prompts of 30 and 45 tokens stray 0.1 nats from alone
    model = TextModel(load_model(vlms.build("qwen4_exp", tmp_path)))
    verdict = choose(model, 2048)
    assert verdict.batching == "alone"
    assert verdict.why == "its caches pick keys by an indexer only past more keys than the trial reads (QSAKVCache)"


def test_a_model_whose_batched_step_fails_runs_alone(tiny) -> None:
    verdict = choose(tiny("gpt_bigcode"), 2048)  # (mlx-lm's model reads its cache's offset as one number)
    assert verdict.batching == "alone", verdict.why
    assert verdict.why.count("its step fails") == 2


def test_a_model_whose_batched_answers_stray_both_ways_runs_alone(tiny) -> None:
    verdict = choose(tiny("gemma2"), 2048)  # (its attention's mask is shaped for one sequence)
    assert verdict.batching == "alone", verdict.why


def test_alone_one_sequence_runs_at_a_time_in_order_on_its_own_caches(demo_engine) -> None:
    batch = ContinuousBatch(demo_engine.model, 512, 8, None, "alone")
    first, second = batch.insert([5, 6, 7], 3, greedy), batch.insert([8, 9], 2, greedy)
    places, emitted = [], []
    while len(batch):
        assert len(places) < 20, "the two sequences did not end"
        emitted += [(e.uid, e.token, e.finish_reason) for e in batch.step()]
        places.append(tuple(found[0] if (found := batch.find(uid)) else "gone" for uid in (first, second)))
    # the second waits, inserted, while the first runs; it starts once the first has left, and ends in its turn
    assert all(second_at == "waiting" for first_at, second_at in places if first_at != "gone")
    assert [(uid, reason) for uid, _, reason in emitted] == [
        (first, None), (first, None), (first, "length"), (second, None), (second, "length")
    ]  # fmt: skip
    # and each draws what it draws in a batch of its own
    for uid, prompt, max_tokens in ((first, [5, 6, 7], 3), (second, [8, 9], 2)):
        own = ContinuousBatch(demo_engine.model, 512, 8, None, "padded")
        own.insert(prompt, max_tokens, greedy)
        tokens = []
        while len(own):
            tokens += [e.token for e in own.step()]
        assert tokens == [token for u, token, _ in emitted if u == uid]
