"""A step of the batch that fails because of one job costs the others nothing: `echo` on a one-token prompt (once
such a step's cause) completes alone and beside others, and a job whose input breaks every step it is in is found
and failed by itself while its companions complete on their first attempt, in their place."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import openai
import pytest

from tests.helpers import wait_ended, wait_event

pytestmark = pytest.mark.timeout(300)
WORDS = "the queue keeps the gpu busy and users informed a job waits starts streams tokens then ends".split()
POISON = "~" * 8  # the demo model never writes "~" (code marks are out of its training text)
BUSY_TOKENS = 1000  # (beside the hostile job: a job that may take the whole KV budget lets none join)


def one_token_word(engine) -> str:  # type: ignore[no-untyped-def]
    word = "a"
    assert len(engine.tokenizer.encode(word)) == 1
    return word


def texts(n: int) -> list[str]:
    return [" ".join(WORDS[(i * 5 + k) % len(WORDS)] for k in range(8 + 3 * i)) for i in range(n)]


LONG_ANSWER = 1000  # tokens: the five still decode when the hostile joins, however slowly a loaded machine admits it


def running(jobs, store, prompts: list[str], max_tokens: int) -> list[str]:  # type: ignore[no-untyped-def]
    """Jobs submitted and making tokens (each has written text)."""
    ids = [jobs.submit(p, max_tokens=max_tokens, ignore_eos=True)["id"] for p in prompts]
    for job_id in ids:
        wait_event(store, job_id, lambda e: e.type == "token")
    return ids


def completed_first_time(store, ids: list[str], max_tokens: int) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    done = [wait_ended(store, job_id, timeout_s=120) for job_id in ids]
    for d in done:
        assert d["status"] == "completed", d
        assert d["usage"]["completion_tokens"] == max_tokens
        assert d["attempts"] == 1, d  # never handed back, nor sent to run alone
        assert "requeued" not in [e.type for e in store.events(d["id"])]
    return done


# --- echo on a one-token prompt -------------------------------------------------------------------------------


def test_echo_of_a_one_token_prompt_scores_it_whole_and_goes_on(client, model, start_worker, store, engine):
    start_worker(max_batch=4)
    word = one_token_word(engine)
    for max_tokens in (0, 3):
        raw = client.completions.with_raw_response.create(
            model=model,
            prompt=word,
            echo=True,
            max_tokens=max_tokens,
            logprobs=1,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        answer = raw.parse()
        choice = answer.choices[0]
        logprobs = choice.logprobs
        assert raw.status_code == 200 and answer.usage.prompt_tokens == 1
        assert choice.text.startswith(word) and answer.usage.completion_tokens == max_tokens
        assert logprobs.tokens[0] == word and len(logprobs.tokens) == 1 + max_tokens
        assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None  # nothing predicts it
        assert all(lp <= 0 for lp in logprobs.token_logprobs[1:])
        assert store.get(raw.headers["x-onelane-job-id"]).attempts == 1


def test_a_one_token_echo_beside_five_running_jobs_leaves_all_six_on_their_first_attempt(
    jobs, client, model, start_worker, store, engine
):
    start_worker(max_batch=6)
    ids = running(jobs, store, texts(5), max_tokens=300)

    raw = client.completions.with_raw_response.create(
        model=model, prompt=one_token_word(engine), echo=True, max_tokens=5, logprobs=0, temperature=0
    )

    echo = store.get(raw.headers["x-onelane-job-id"])
    assert raw.status_code == 200 and echo.attempts == 1
    assert raw.parse().choices[0].logprobs.token_logprobs[0] is None
    done = completed_first_time(store, ids, 300)
    assert echo.timings.started_at < min(d["timings"]["finished_at"] for d in done)  # it did share their batch


# --- a job whose input breaks the step ------------------------------------------------------------------------


class Poisoned:
    """The demo model, which fails a forward pass that reads a prompt holding POISON (as a model may fail on an
    input it cannot take): one job's input breaks the whole batch's step."""

    def __init__(self, model: Any, poison: int) -> None:
        self.model, self.poison = model, poison

    def __call__(self, tokens: Any, cache: Any = None) -> Any:
        if tokens.shape[-1] > 1:  # (a prompt's chunk: a decode step's tokens are not waited for here)
            rows = np.array(tokens)
            if any(np.convolve(row == self.poison, np.ones(4), "valid").max(initial=0) >= 4 for row in rows):
                raise ValueError("the model cannot read this input")
        return self.model(tokens, cache=cache)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


@pytest.fixture
def poisoned(engine):  # type: ignore[no-untyped-def]
    """The session's engine serving the Poisoned model, for this story (start the worker after it)."""
    model = engine.model
    engine.model = Poisoned(model, engine.tokenizer.encode(POISON)[0])
    engine.reset()
    yield
    engine.model = model
    engine.reset()


def test_a_job_whose_input_breaks_the_step_beside_five_running_ones_fails_alone(jobs, store, start_worker, poisoned):
    start_worker(max_batch=6)
    ids = running(jobs, store, texts(5), max_tokens=LONG_ANSWER)

    hostile = jobs.submit(f"the queue {POISON} keeps", max_tokens=20)["id"]

    failed = wait_ended(store, hostile, timeout_s=120)
    assert failed["status"] == "failed" and failed["error"]["type"] == "generation_error"
    # the one new to the batch was blamed: sent to run alone (its failure in company might not have been its own)
    assert failed["attempts"] == 2 and "requeued" in [e.type for e in store.events(hostile)]
    completed_first_time(store, ids, LONG_ANSWER)


def test_an_echo_whose_prompt_breaks_its_reading_fails_alone_and_at_once(
    jobs, client, model, start_worker, store, poisoned
):
    start_worker(max_batch=6)
    ids = running(jobs, store, texts(5), max_tokens=200)

    with pytest.raises(openai.InternalServerError) as raised:  # (its prompt is read outside the batch's step)
        client.completions.create(model=model, prompt=f"the queue {POISON} keeps", echo=True, max_tokens=0, logprobs=0)

    hostile = raised.value.message.rsplit(" ", 1)[-1]  # ("... the worker logged the error for job <id>")
    assert store.get(hostile).attempts == 1 and store.get(hostile).status.value == "failed"
    completed_first_time(store, ids, 200)


def test_a_job_whose_input_breaks_the_step_among_six_joining_together_is_found_by_halving(
    jobs, store, start_worker, poisoned
):
    prompts = texts(6)
    prompts[4] = f"the queue {POISON} keeps"
    ids = [jobs.submit(p, max_tokens=60, ignore_eos=True)["id"] for p in prompts]
    start_worker(max_batch=6)  # (all six join the empty batch at once: every one is new to it)

    failed = wait_ended(store, ids[4], timeout_s=120)
    assert failed["status"] == "failed" and failed["error"]["type"] == "generation_error" and failed["attempts"] == 2
    completed_first_time(store, ids[:4] + ids[5:], 60)


# --- a step that never returns ----------------------------------------------------------------------------------


class Hanging:
    """The demo model, whose forward pass over a prompt holding POISON never returns (until the story lets it): a
    model that cannot make progress, as a native hang would be."""

    def __init__(self, model: Any, poison: int) -> None:
        self.model, self.poison, self.release = model, poison, threading.Event()

    def __call__(self, tokens: Any, cache: Any = None) -> Any:
        if tokens.shape[-1] > 1 and self.poison in np.array(tokens):
            self.release.wait(timeout=120)
        return self.model(tokens, cache=cache)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def test_a_step_that_never_returns_fails_its_jobs_in_seconds_not_at_the_stall_timeout(
    jobs, store, start_worker, engine
):
    model = engine.model
    engine.model = hanging = Hanging(model, engine.tokenizer.encode(POISON)[0])
    engine.reset()
    try:
        # Given a worker whose model's pace it has measured on a few jobs (ONELANE_STALL_S is its default, 120 s)
        start_worker(max_batch=4)
        warm = [jobs.submit(p, max_tokens=16, ignore_eos=True)["id"] for p in texts(2)]
        assert [wait_ended(store, job_id)["status"] for job_id in warm] == ["completed"] * 2
        # When a job's prompt makes the step hang, beside a running job
        beside = running(jobs, store, texts(1), max_tokens=BUSY_TOKENS)[0]
        began = time.monotonic()
        hostile = jobs.submit(f"the queue {POISON} keeps", max_tokens=20)["id"]
        # Then the supervisor's look at the device (its every round) ends both as stalled within seconds
        stalled: list[str] = []
        while not stalled:
            assert time.monotonic() - began < 60, "the hung step was not seen within 60 s"
            stalled = store.upkeep.watch_device()[1]
            time.sleep(0.2)  # (the supervisor's round)
        took = time.monotonic() - began
        assert sorted(stalled) == sorted([hostile, beside])
        failed = store.get(hostile)
        assert (failed.status.value, failed.error.type) == ("failed", "stalled")
        assert "a step of its batch has run over 15 s" in failed.error.message, failed.error.message
        assert 15 <= took < min(40, store.settings.stall_s), took  # (the stall timeout, by default 120 s, not yet)
    finally:
        hanging.release.set()
        engine.model = model
        engine.reset()
