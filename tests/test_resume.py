"""A job whose worker died (or stopped, or whose batch failed) goes on from the tokens it had generated: its next run
reads them as prompt, with its sampler where it was, and writes only what follows. Nothing a client was sent is
sampled again, so nothing is taken back, repeated or lost, whatever a second prefill computes. The stories' workers
speculate whatever it costs this machine (ONELANE_SPECULATE_ALWAYS): a resumed run goes on as exactly with proposals
checked and cut as without."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import mlx.core as mx
import pytest
import requests

from tasks import keys
from tasks.catalogue import SHIPPED_DEMO_MODEL
from tasks.job import SamplingParams
from tasks.store import Delivered
from tests.helpers import wait_ended, wait_event
from tests.test_recovery import wait_for_worker
from worker.batch.sampling import make_sampler
from worker.resume import resume


@pytest.fixture(scope="module")
def engine():  # type: ignore[no-untyped-def]
    """The shipped demo model, which writes words (the random one's tokens give text only at its end)."""
    from worker.batch.engine import Engine

    return Engine.load(str(SHIPPED_DEMO_MODEL))


SYSTEM = "You answer questions about queues, GPUs and the people who wait for them, briefly and kindly. " * 12


def logged_text(store, job_id: str) -> str:  # type: ignore[no-untyped-def]
    """The text of the job's token events, in log order."""
    return "".join(e.text for e in store.events(job_id) if e.type == "token")


def chat(base_url: str, model: str, messages: list[dict[str, str]], **params: Any) -> requests.Response:
    body = {"model": model, "messages": messages, **params}
    return requests.post(f"{base_url}/v1/chat/completions", json=body, stream=bool(params.get("stream")), timeout=60)


def test_a_sampled_stream_read_from_the_cache_goes_on_across_a_worker_kill_without_a_gap_or_a_repeat(
    live_server, store, worker_process
):
    # Given a chat's first turn, whose history the worker's prefix cache now holds
    worker_process(ONELANE_SPECULATE_ALWAYS="true")
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is a queue?"}]
    model = store.settings.model_name
    answer = chat(live_server, model, first, max_tokens=16, temperature=0).json()["choices"][0]["message"]["content"]
    follow_up = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "And who waits?"}]

    # When its follow-up, sampled with a seed, streams, and the worker is killed once it has written some of it
    sampled = {"temperature": 0.9, "seed": 5, "max_tokens": 1500, "ignore_eos": True, "stream": True}
    with chat(live_server, model, follow_up, **sampled) as response:
        job_id = response.headers["x-onelane-job-id"]
        wait_event(store, job_id, lambda e: e.type == "token" and e.index >= 8)
        assert int(store.redis.hget(keys.job(job_id), "cached_tokens")) > 0  # this run read its history from the cache
        os.kill(wait_for_worker(store).pid, signal.SIGKILL)
        lines = [ln.removeprefix("data: ") for ln in response.iter_lines(decode_unicode=True) if ln.startswith("data")]

    # Then the stream ends completed, and what it sent is the job's answer once, in order, whole
    chunks = [json.loads(ln) for ln in lines[:-1]]
    assert lines[-1] == "[DONE]" and not [c for c in chunks if "error" in c]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    done = wait_ended(store, job_id, timeout_s=90)
    assert (done["status"], done["attempts"], done["usage"]["completion_tokens"]) == ("completed", 2, 1500)
    assert streamed == done["output"] == logged_text(store, job_id)
    requeued = next(e for e in store.events(job_id) if e.type == "requeued")
    assert requeued.completion_tokens > 0  # it kept what it had
    assert not store.redis.exists(keys.tokens(job_id))  # the token record goes with the run that needed it


@pytest.mark.parametrize(
    "params",
    [{"temperature": 0}, {"temperature": 0.9, "seed": 11}, {"temperature": 0.9}],
    ids=["greedy", "seeded", "its own seed"],
)
def test_a_job_handed_back_mid_answer_goes_on_and_writes_what_it_would_have_uninterrupted(
    params, jobs, store, start_worker
):
    # Given the answer a job gives alone, uninterrupted
    job = {"prompt": "The queue", "max_tokens": 600, "ignore_eos": True, **params}
    worker = start_worker(drain_s=0, speculate_always=True)
    whole = wait_ended(store, jobs.submit(**job)["id"], timeout_s=90)["output"]

    # When the same job is handed back by a worker that stops mid-answer, and another worker runs it on
    job_id = jobs.submit(**job)["id"]
    store.follow_live(store.get(job_id))  # as a stream opened on it would: its tokens written as they come
    wait_event(store, job_id, lambda e: e.type == "token" and e.index >= 2)
    worker.stop()
    kept = store.get(job_id)
    assert kept.status.value == "queued" and 0 < kept.usage.completion_tokens < 600
    start_worker(speculate_always=True)
    done = wait_ended(store, job_id, timeout_s=90)

    # Then it kept what it had written, and wrote only the rest (no token sampled twice)
    assert done["output"].startswith(kept.output) and done["usage"]["completion_tokens"] == 600
    assert logged_text(store, job_id) == done["output"]
    if "seed" in job or job["temperature"] == 0:  # (an unseeded job's seed comes from its id: another job here)
        # greedy, or seeded: the same as uninterrupted, on this build of MLX, for 1,000 characters past the hand-back
        # at least (farther on, a near-tie may fall the other way: the kept tokens' re-read differs in its last bits
        # from the decode steps it replaces, as a cache hit's does; seeded, handed back at its 12th token: the text
        # parts at its 3,835th character, in 2 of 2 such runs of 1,500 tokens; at its 13th to 17th: whole, in 10 of 10)
        part = len(kept.output) + 1000
        assert done["output"][:part] == whole[:part]
    if not job["temperature"]:
        assert done["timings"]["accepted_tokens"] > 0  # (its steps checked proposals, and kept some)


def test_a_seeded_samplers_key_goes_on_where_the_earlier_run_left_it():
    params = SamplingParams(temperature=1.0, seed=42)
    logits = mx.log(mx.softmax(mx.random.normal((1, 64), key=mx.random.key(0))))
    fresh = make_sampler(params)
    draws = [fresh(logits).item() for _ in range(12)]
    assert len(set(draws)) > 1  # a sampler that draws (else the test would prove nothing)

    assert [make_sampler(params, drawn=5)(logits).item() for _ in range(1)] == draws[5:6]
    later = make_sampler(params, drawn=5)
    assert [later(logits).item() for _ in range(7)] == draws[5:]


def ids_of(engine, text: str) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
    return tuple(engine.tokenizer.encode(text))


@pytest.mark.parametrize(
    ("delivered", "params", "ended", "rest"),
    [
        ("the queue moves", SamplingParams(max_tokens=64), None, ""),  # more to generate
        ("the queue moves", SamplingParams(max_tokens=3), "length", ""),  # its max_tokens were all generated
        ("the queue moves", SamplingParams(max_tokens=64, stop=("moves",)), "stop", ""),  # a stop string in it
        ("the queue mov", SamplingParams(max_tokens=64, stop=("movement",)), None, ""),  # maybe one: held back
    ],
    ids=["more to come", "at max_tokens", "at a stop string", "a stop string's start held back"],
)
def test_a_resumed_run_starts_where_the_earlier_one_stopped(engine, delivered, params, ended, rest):
    ids = ids_of(engine, delivered)
    if params.max_tokens == 3:
        ids = ids[:3]
    detokenizer = engine.detokenizer()
    for token in ids:
        detokenizer.add_token(token)
    written = params.stop and delivered.split(params.stop[0][:6])[0] or detokenizer.text
    if ended == "length":
        detokenizer.finalize()
        written = detokenizer.text
    start = resume(engine.detokenizer(), params, Delivered(ids, written), engine.eos)
    assert (start.ended, start.rest) == (ended, rest)
    assert start.at == (len(ids), len(written.encode()))


def test_a_run_whose_only_ending_was_lost_ends_at_once_at_its_eos(engine):
    ids = (*ids_of(engine, "the end"), min(engine.eos))
    start = resume(engine.detokenizer(), SamplingParams(max_tokens=64), Delivered(ids, "the end"), engine.eos)
    assert (start.ended, start.rest) == ("stop", "")
    # with ignore_eos the EOS token is one more token, and the run goes on
    go_on = SamplingParams(max_tokens=64, ignore_eos=True)
    assert resume(engine.detokenizer(), go_on, Delivered(ids, "the end"), engine.eos).ended is None
