"""Several answers to one prompt, log probabilities, penalties and biases, as the worker makes them: the n answers of
a request read their prompt once, each token's log probability is the one mlx-lm computes (alone or in a full
batch), and OpenAI's penalties and biases change the answer as their definitions say."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from tasks.job import Choice, JobSpec, Message, SamplingParams
from tasks.logprobs import read_entries, read_prompt
from tests.helpers import wait_ended

pytestmark = pytest.mark.timeout(300)


def admit(store, text: str, job_id: str, choice: Choice | None = None, chat: bool = False, **params) -> str:  # type: ignore[no-untyped-def]
    spec = JobSpec(
        owner="t",
        model=store.settings.model_name,
        prompt=None if chat else text,
        messages=(Message(role="user", content=text),) if chat else None,
        params=SamplingParams(**params),
        choice=choice,
    )
    return store.admit(job_id, spec, 120).id


def group(store, text: str, n: int, **params) -> list[str]:  # type: ignore[no-untyped-def]
    ids = [f"job_g{i}" for i in range(n)]
    for i, job_id in enumerate(ids):
        admit(store, text, job_id, Choice(group=ids[0], index=i, of=n), **params)
    return ids


def reference(engine, prompt: list[int], max_tokens: int, processor=None) -> tuple[list[int], list[float]]:  # type: ignore[no-untyped-def]
    """The greedy tokens and their log probabilities as mlx-lm's own generate_step gives them, alone."""
    tokens, logprobs = [], []
    processors = [processor] if processor else None
    steps = generate_step(mx.array(prompt), engine.model, max_tokens=max_tokens, logits_processors=processors)
    for token, row in steps:
        tokens.append(int(token))
        logprobs.append(row[int(token)].item())
        if int(token) in engine.eos:
            break
    return tokens, logprobs


def test_the_answers_of_one_request_read_their_prompt_once(store, start_worker, engine):
    prompt = "the quick brown fox jumps over the lazy dog " * 6
    ids = group(store, prompt, 4, max_tokens=12, ignore_eos=True)
    start_worker(max_batch=8)
    done = [wait_ended(store, job_id) for job_id in ids]

    assert {d["status"] for d in done} == {"completed"}
    assert len({d["output"] for d in done}) == 1  # greedy: one answer, four times
    prompt_tokens = done[0]["usage"]["prompt_tokens"]
    # one of them read the prompt; the three others copied it, all but the last token they read themselves
    assert sorted(d["usage"]["cached_tokens"] for d in done) == [0, *([prompt_tokens - 1] * 3)]


def test_the_others_read_the_prompt_themselves_when_the_first_is_cancelled_before_its_first_token(
    store, start_worker, engine
):
    from tests.helpers import wait_event

    prompt = "the quick brown fox jumps over the lazy dog " * 80  # read 16 tokens a step: some 50 steps
    ids = group(store, prompt, 3, max_tokens=8, ignore_eos=True)
    start_worker(max_batch=8, prefill_step=16)
    wait_event(store, ids[0], lambda e: e.type == "started")
    store.cancel(ids[0], "t")
    done = [wait_ended(store, job_id) for job_id in ids]

    assert done[0]["status"] == "cancelled" and done[0]["usage"]["completion_tokens"] == 0
    assert [d["status"] for d in done[1:]] == ["completed", "completed"]
    assert done[1]["output"] == done[2]["output"] and len(done[1]["output"]) > 0
    assert [d["usage"]["cached_tokens"] for d in done[1:]] == [0, 0]  # nothing was read for them


def test_seeded_answers_of_one_request_differ_and_each_is_its_own(store, start_worker, engine):
    prompt = "once upon a time " * 10
    ids = [f"job_s{i}" for i in range(3)]
    for i, job_id in enumerate(ids):
        admit(store, prompt, job_id, Choice(group=ids[0], index=i, of=3), max_tokens=16, temperature=1.0, seed=7 + i)
    alone = [admit(store, prompt, f"job_a{i}", max_tokens=16, temperature=1.0, seed=7 + i) for i in range(3)]
    start_worker(max_batch=8)

    shared = [wait_ended(store, job_id)["output"] for job_id in ids]
    assert len(set(shared)) == 3
    assert shared == [wait_ended(store, job_id)["output"] for job_id in alone]  # reading the prompt once changes none


@pytest.mark.default_model
def test_log_probabilities_are_mlx_lms_alone_and_in_a_full_batch(store, start_worker, engine):
    text = "Name the three primary colours."
    prompt = engine.prompt_tokens(JobSpec(owner="t", model="m", messages=(Message(role="user", content=text),)))
    tokens, expected = reference(engine, prompt, 24)
    first = admit(store, text, "job_alone", chat=True, max_tokens=24, logprobs=True, top_logprobs=5)
    start_worker(max_batch=8)
    wait_ended(store, first)
    crowd = [admit(store, f"Tell me about the number {n}.", f"job_c{n}", chat=True, max_tokens=40) for n in range(7)]
    batched = admit(store, text, "job_batched", chat=True, max_tokens=24, logprobs=True, top_logprobs=5)
    for job_id in (first, batched):
        wait_ended(store, job_id)
        job = store.get(job_id)
        entries = read_entries(job.logprobs)
        assert [e.bytes for e in entries] == [engine.token_bytes[t] for t in tokens if t not in engine.eos]
        assert [e.logprob for e in entries] == pytest.approx(expected[: len(entries)], abs=1e-4)
        assert b"".join(e.bytes for e in entries).decode() == job.output
        for e in entries:
            assert [lp for _, lp in e.top] == sorted((lp for _, lp in e.top), reverse=True)
            assert len(e.top) == 5 and e.top[0][1] == pytest.approx(e.logprob, abs=1e-6)  # greedy: its own is first
    crowd_done = [wait_ended(store, job_id) for job_id in crowd]
    assert {d["status"] for d in crowd_done} == {"completed"}
    # it ran in a full batch: it started before any of the seven others ended
    assert store.get(batched).timings.started_at < min(d["timings"]["finished_at"] for d in crowd_done)


def test_openai_penalties_change_the_answer_as_defined(store, start_worker, engine):
    prompt = "a b a b a b a b"
    ids = engine.tokenizer.encode(prompt)

    def openai_penalties(tokens: mx.array, logits: mx.array) -> mx.array:  # OpenAI's definition, over generated ones
        counts = mx.zeros((logits.shape[-1],))
        generated = tokens[len(ids) :]
        if generated.size:
            counts = counts.at[generated].add(1.0)
        return logits - 0.8 * counts - 0.5 * (counts > 0)

    expected, _ = reference(engine, ids, 20, openai_penalties)
    plain, _ = reference(engine, ids, 20)
    assert expected != plain  # (the penalties matter to this answer)
    job_id = admit(store, prompt, "job_p", max_tokens=20, frequency_penalty=0.8, presence_penalty=0.5, logprobs=True)
    start_worker()
    wait_ended(store, job_id)
    got = store.get(job_id)
    assert b"".join(e.bytes for e in read_entries(got.logprobs)).decode(errors="replace") == got.output
    assert got.output == engine.tokenizer.decode(expected)


def test_a_banned_token_never_appears_and_a_forced_one_always_does(store, start_worker, engine):
    prompt = "the quick brown fox"
    first, _ = reference(engine, engine.tokenizer.encode(prompt), 12)
    banned = admit(store, prompt, "job_ban", max_tokens=12, ignore_eos=True, logprobs=True, logit_bias={first[0]: -100})
    forced = admit(store, prompt, "job_force", max_tokens=6, ignore_eos=True, logprobs=True, logit_bias={first[0]: 100})
    beyond = admit(store, prompt, "job_beyond", max_tokens=6, logit_bias={10**6: 5})
    start_worker()

    wait_ended(store, banned), wait_ended(store, forced)
    chosen = engine.token_bytes[first[0]]
    assert chosen not in [e.bytes for e in read_entries(store.get(banned).logprobs)]
    assert [e.bytes for e in read_entries(store.get(forced).logprobs)] == [chosen] * 6
    failed = wait_ended(store, beyond)
    assert failed["status"] == "failed" and failed["error"]["type"] == "invalid_request"
    assert "logit_bias" in failed["error"]["message"]


def test_a_prompt_is_scored_without_generating(store, start_worker, engine):
    prompt = "the quick brown fox jumps over the lazy dog"
    ids = engine.tokenizer.encode(prompt)
    logits = engine.model(mx.array([ids]))[0].astype(mx.float32)
    rows = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    expected = [rows[i, ids[i + 1]].item() for i in range(len(ids) - 1)]
    scored = admit(store, prompt, "job_score", max_tokens=0, prompt_logprobs=True, top_logprobs=2)
    then = admit(store, prompt, "job_then", max_tokens=5, prompt_logprobs=True, logprobs=True, ignore_eos=True)
    start_worker()

    done = wait_ended(store, scored)
    assert done["status"] == "completed" and done["usage"]["completion_tokens"] == 0 and done["output"] == ""
    entries = read_prompt(store.get(scored).prompt_logprobs)
    assert b"".join(e.bytes for e in entries) == prompt.encode()
    assert entries[0].logprob is None
    assert [e.logprob for e in entries[1:]] == pytest.approx(expected, abs=1e-4)
    wait_ended(store, then)
    job = store.get(then)
    assert len(read_prompt(job.prompt_logprobs)) == len(ids) and len(read_entries(job.logprobs)) == 5


def test_a_worker_killed_mid_answer_keeps_one_log_probability_per_token(store, worker_process, start_worker):
    import os
    import signal

    from tests.helpers import wait_event
    from tests.test_recovery import wait_for_worker

    params = {"max_tokens": 600, "ignore_eos": True, "temperature": 0.9, "seed": 5, "logprobs": True, "top_logprobs": 2}
    killed = admit(store, "the story of a fox", "job_killed", **params)
    store.follow_live(store.get(killed))  # as a stream opened on it would: its tokens written as they come
    worker_process()
    wait_event(store, killed, lambda e: e.type == "token" and e.index >= 3, timeout_s=60)
    os.kill(wait_for_worker(store).pid, signal.SIGKILL)
    done = wait_ended(store, killed, timeout_s=90)
    assert (done["status"], done["attempts"]) == ("completed", 2)

    whole = admit(store, "the story of a fox", "job_whole", **params)  # the same job, never interrupted
    wait_ended(store, whole, timeout_s=90)
    entries = {job_id: read_entries(store.get(job_id).logprobs) for job_id in (killed, whole)}
    assert len(entries[killed]) == 600 == len(entries[whole])
    assert [e.bytes for e in entries[killed]] == [e.bytes for e in entries[whole]]
    assert [e.logprob for e in entries[killed]] == pytest.approx([e.logprob for e in entries[whole]], abs=1e-4)


@pytest.mark.parametrize("width", [49152, 151936, 1000, 300])
def test_the_top_alternatives_are_exactly_the_largest(width):
    from worker.batch.logits import top_k

    rows = mx.random.normal((4, width), key=mx.random.key(width))
    rows = mx.where(mx.arange(width) % 3 == 0, -mx.inf, rows)  # a grammar's mask rules out a third of them
    for k in (1, 5, 20):
        got = mx.take_along_axis(rows, top_k(rows, k), axis=-1)
        assert mx.array_equal(mx.sort(got, axis=-1), mx.sort(mx.topk(rows, k, axis=-1), axis=-1))
