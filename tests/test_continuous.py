"""The continuous batch (worker/batch/forward.py): a joining prompt costs its prefill and a row, not a pass of its own."""

from __future__ import annotations

from typing import Any

from tasks.job import JobSpec, SamplingParams
from worker.batch.forward import ContinuousBatch
from worker.batch.sampling import make_sampler


class Counted:
    """The model, its forward passes recorded (the shape of what each one read)."""

    def __init__(self, model: Any) -> None:
        self.model, self.calls = model, []

    def __call__(self, tokens: Any, cache: Any = None) -> Any:
        self.calls.append(tuple(tokens.shape))
        return self.model(tokens, cache=cache)

    def __getattr__(self, name: str) -> Any:  # (its layers, to make caches)
        return getattr(self.model, name)


def greedy_alone(engine: Any, prompt: list[int], n: int) -> list[int]:
    batch = ContinuousBatch(engine.model, 512, 8, None)
    batch.insert(prompt, n, make_sampler(SamplingParams(temperature=0)))
    out: list[int] = []
    while len(batch):
        out += [e.token for e in batch.step()]
    return out


def test_a_prompt_joining_a_decoding_batch_reads_its_last_token_as_a_row_of_the_same_steps_decode_pass(engine):
    # Given a batch decoding one sequence
    prompts = [engine.prompt_tokens(JobSpec(owner="t", model="m", prompt=p)) for p in ("a job waits", "then ends ok")]
    model = Counted(engine.model)
    batch = ContinuousBatch(model, 512, 8, None)
    greedy = make_sampler(SamplingParams(temperature=0))
    first = batch.insert(prompts[0], 12, greedy)
    made: dict[int, list[int]] = {first: []}
    for _ in range(3):
        for e in batch.step():
            made[e.uid].append(e.token)
    # When another prompt joins
    model.calls.clear()
    second = batch.insert(prompts[1], 6, greedy)
    made[second] = []
    steps = []
    while len(batch):
        model.calls.clear()
        for e in batch.step():
            made[e.uid].append(e.token)
        steps.append(list(model.calls))
    # Then the step it joins reads its prompt but its last token, and its decode pass reads that token as a second
    # row beside the decoding sequence's: no forward pass of its own, and its first token drawn in that very step
    assert steps[0] == [(1, len(prompts[1]) - 1), (2, 1)]
    assert steps[1] == [(2, 1)]
    assert all(len(calls) == 1 for calls in steps[1:-1])
    # and each sequence makes the tokens it makes alone
    assert made[first] == greedy_alone(engine, prompts[0], 12)
    assert made[second] == greedy_alone(engine, prompts[1], 6)


def test_a_sequence_ending_at_max_tokens_is_drawn_no_token_past_its_last(engine):
    # Given one sequence that may draw 5 tokens
    prompt = engine.prompt_tokens(JobSpec(owner="t", model="m", prompt="a job waits"))
    model = Counted(engine.model)
    batch = ContinuousBatch(model, 512, 8, None)
    batch.insert(prompt, 5, make_sampler(SamplingParams(temperature=0)), stops=frozenset())
    # When it runs to its end
    ended = []
    while len(batch):
        ended += [e for e in batch.step() if e.finish_reason]
    # Then the model read its prompt (all but its last token, then that token as a decode row) and each of its
    # draws but the last, which ends it: one forward pass per token drawn, none for a sixth nobody reads
    assert model.calls == [(1, len(prompt) - 1)] + [(1, 1)] * 5
    (end,) = ended
    assert end.finish_reason == "length"
    # and the KV state it leaves holds every token it read: its prompt and its draws but the last
    assert end.tokens is not None and end.cache is not None
    assert len(end.tokens) == len(prompt) + 4 == end.cache[0].offset
