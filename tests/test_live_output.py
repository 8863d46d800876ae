"""A job's tokens are written the moment they come only while a client reads them as they come (a stream). A plain
request waits for the whole answer, and a batch's line for nobody: their tokens go out in quiet windows
(worker/output.py), each write costing Redis, the web and the model's CPU less. A stream opened later on such a job
gets the rest as it comes."""

from __future__ import annotations

import time

import pytest
import requests

from tasks.catalogue import SHIPPED_DEMO_MODEL
from tests.helpers import EventStream, wait_ended, wait_event

# a device this slow takes longer than the writer's window (FLUSH_S, 20 ms) over every token, with room for a writer
# thread woken late on a loaded machine (at 50 ms, two of 12 tokens once went out in one write)
STEP_S = 0.1


@pytest.fixture(scope="module")
def engine():  # type: ignore[no-untyped-def]
    """The shipped demo model, which writes words token by token (the random one's tokens give text only at its
    end, and a token without text writes no event)."""
    from worker.batch.engine import Engine

    return Engine.load(str(SHIPPED_DEMO_MODEL))


@pytest.fixture
def paced(engine, monkeypatch):  # type: ignore[no-untyped-def]
    """The engine, as slow as a device of STEP_S a step: each token leaves its step after the window closed."""
    step = engine.step

    def slow_step():  # type: ignore[no-untyped-def]
        time.sleep(STEP_S)  # (the pace of a device, not a wait for anything)
        return step()

    monkeypatch.setattr(engine, "step", slow_step)
    return engine


def token_writes(store, job_id: str) -> int:  # type: ignore[no-untyped-def]
    return sum(1 for e in store.events(job_id) if e.type == "token")


def test_a_plain_answer_is_written_in_quiet_windows_and_a_streamed_one_token_by_token(
    live_server, store, start_worker, paced, model
):
    # Given a worker whose every step takes longer than the writer's window
    start_worker()

    # When the same answer of 12 tokens is asked for plainly, then streamed
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 12,
        "ignore_eos": True,
        "temperature": 0,
    }
    plain = requests.post(f"{live_server}/v1/chat/completions", json=body, timeout=30)
    with requests.post(
        f"{live_server}/v1/chat/completions", json={**body, "stream": True}, stream=True, timeout=30
    ) as streamed:
        chunks = [line for line in streamed.iter_lines() if line.startswith(b"data: {")]

    # Then both answers are whole, but the plain one was written in at most a few writes (its first text at once,
    # the rest with its end), and the streamed one as its tokens came
    assert plain.status_code == 200 and plain.json()["usage"]["completion_tokens"] == 12
    quiet, live = plain.headers["x-onelane-job-id"], streamed.headers["x-onelane-job-id"]
    assert store.get(quiet).output == store.get(live).output
    assert token_writes(store, quiet) <= 3
    assert token_writes(store, live) >= 8 and len(chunks) >= 8


def test_a_stream_opened_on_a_running_quiet_job_gets_the_rest_as_it_comes(
    jobs, live_server, store, start_worker, paced
):
    # Given a job submitted plainly, running, its first text written
    start_worker()
    job_id = jobs.submit("hello", max_tokens=40, ignore_eos=True)["id"]
    wait_event(store, job_id, lambda e: e.type == "token")
    before = token_writes(store, job_id)

    # When a client opens its event stream
    stream = EventStream(live_server, job_id)
    tokens = [e for e in stream if e.get("event") == "token"]
    stream.close()

    # Then the rest of its tokens reach it as they come: many writes, not one a second
    assert wait_ended(store, job_id)["status"] == "completed"
    assert token_writes(store, job_id) - before >= 15
    assert "".join(e["data"]["text"] for e in tokens) == store.get(job_id).output


def test_a_stream_opened_while_the_job_waits_has_it_written_live_from_its_start(
    jobs, live_server, store, start_worker, paced
):
    # Given a job submitted plainly, waiting for a worker, and a client that opens its event stream meanwhile
    job_id = jobs.submit("hello", max_tokens=12, ignore_eos=True)["id"]
    stream = EventStream(live_server, job_id)

    # When a worker starts it
    start_worker()
    events = list(stream)
    stream.close()

    # Then its tokens were written as they came
    assert events[-1]["event"] == "completed"
    assert token_writes(store, job_id) >= 8
