"""OpenAI's Responses API on the queue, with the official SDK, unchanged: background responses polled, cancelled and
streamed (a cut stream resumed with `starting_after`), and foreground ones, whole or streamed."""

from __future__ import annotations

import json

import openai
import pytest
import requests

from tasks.job import JobStatus
from tests.helpers import BUSY, DEMO, wait_ended, wait_event

MODEL = DEMO
pytestmark = pytest.mark.default_catalog


@pytest.fixture
def worker(start_worker):  # type: ignore[no-untyped-def]
    return start_worker()


def job_of(response_id: str) -> str:
    return "job_" + response_id.removeprefix("resp_")


def background(client, text="hi", tokens=8, **kw):  # type: ignore[no-untyped-def]
    return client.responses.create(
        model=MODEL,
        input=text,
        background=True,
        max_output_tokens=tokens,
        temperature=0,
        extra_body={"ignore_eos": True},
        **kw,
    )


def test_a_background_response_is_queued_at_once_then_polled_until_completed(client, worker, store):
    # Given a worker, When a background response is created
    created = background(client, "Once upon a time", tokens=6, instructions="Tell a story.", metadata={"k": "v"})

    # Then it answers at once, queued (or already further), and retrieve follows it to the end
    assert created.status in ("queued", "in_progress", "completed") and created.background is True
    wait_ended(store, job_of(created.id))
    done = client.responses.retrieve(created.id)
    job = store.get(job_of(created.id))
    assert done.status == "incomplete" and done.incomplete_details.reason == "max_output_tokens"  # 6 tokens, no EOS
    assert done.output_text == job.output != ""
    assert done.usage.output_tokens == 6 and done.usage.input_tokens == job.usage.prompt_tokens > 0
    assert done.usage.input_tokens_details.cached_tokens == job.usage.cached_tokens
    assert (done.instructions, done.metadata, done.model) == ("Tell a story.", {"k": "v"}, MODEL)
    assert job.spec.messages[0].role == "system" and job.spec.messages[0].content == "Tell a story."


def test_a_response_that_ends_itself_is_completed(client, worker):
    created = client.responses.create(model=MODEL, input="hi", background=True, max_output_tokens=200, temperature=0)
    done = client.responses.retrieve(created.id)
    while done.status in ("queued", "in_progress"):
        done = client.responses.retrieve(created.id)  # (each poll is a round trip: no sleep needed to wait)
    assert done.status in ("completed", "incomplete")
    assert done.output[0].content[0].text == done.output_text


def test_cancel_while_queued_never_runs_and_is_idempotent(client, store):
    # Given no worker: the response waits
    created = background(client)

    cancelled = client.responses.cancel(created.id)
    again = client.responses.cancel(created.id)

    assert cancelled.status == again.status == "cancelled" and cancelled.output == []
    assert store.get(job_of(created.id)).timings.started_at is None


def test_cancel_while_running_keeps_the_partial_output(client, worker, store):
    created = background(client, "on and on", tokens=BUSY)
    wait_event(store, job_of(created.id), lambda e: e.type == "token")

    cancelled = client.responses.cancel(created.id)

    assert cancelled.status == "cancelled"
    job = store.get(job_of(created.id))
    assert job.status is JobStatus.CANCELLED and 0 < job.usage.completion_tokens < BUSY
    assert client.responses.retrieve(created.id).output_text == job.output


def test_a_stream_cut_mid_way_resumes_after_its_last_sequence_number_with_every_delta_once(client, worker, store):
    # Given a background response streamed from its creation
    stream = client.responses.create(
        model=MODEL,
        input="Tell me more",
        background=True,
        stream=True,
        max_output_tokens=40,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    seen, deltas = [], []
    for event in stream:
        seen.append(event)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
            if len(deltas) == 3:
                break  # When the connection drops after three deltas
    stream.close()
    response_id = seen[0].response.id
    assert [e.type for e in seen[:4]] == [
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.output_item.added",
    ]

    # Then a stream resumed after the last sequence number gets the rest, each delta once, and ends the response
    rest = list(client.responses.retrieve(response_id, stream=True, starting_after=seen[-1].sequence_number))
    numbers = [e.sequence_number for e in seen + rest]
    assert numbers == list(range(len(numbers)))
    deltas += [e.delta for e in rest if e.type == "response.output_text.delta"]
    final = rest[-1]
    assert final.type == "response.incomplete" and final.response.output_text == "".join(deltas)
    assert "".join(deltas) == store.get(job_of(response_id)).output
    # and a background response runs on whether or not anyone follows it: the cut did not cancel it
    assert store.get(job_of(response_id)).status is JobStatus.COMPLETED


def test_the_whole_stream_again_is_numbered_the_same(client, worker, store):
    created = background(client, tokens=5)
    wait_ended(store, job_of(created.id))
    first = [(e.sequence_number, e.type) for e in client.responses.retrieve(created.id, stream=True)]
    again = [(e.sequence_number, e.type) for e in client.responses.retrieve(created.id, stream=True, starting_after=0)]
    assert again == first[1:] and first[-1][1] == "response.incomplete"
    assert [t for _, t in first].count("response.output_text.delta") >= 1


def test_a_foreground_response_whole_and_streamed(client, worker):
    whole = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": "hi"}],
        max_output_tokens=5,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert whole.status == "incomplete" and whole.background is False and whole.output_text
    assert whole.usage.output_tokens == 5

    events = list(
        client.responses.create(
            model=MODEL, input="hi", max_output_tokens=5, temperature=0, stream=True, extra_body={"ignore_eos": True}
        )
    )
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == text == whole.output_text


def test_a_foreground_response_cannot_be_cancelled_by_id_and_other_jobs_are_not_responses(client, worker, jobs):
    whole = client.responses.create(model=MODEL, input="hi", max_output_tokens=2, temperature=0)
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(whole.id)
    job = jobs.submit("a plain job", max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_" + job["id"].removeprefix("job_"))
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nothing")


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"store": False, "background": True}, "store"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"input": []}, "input"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
        ({"reasoning": {"effort": "huge"}}, "reasoning.effort"),
        ({"include": ["file_search_call.results"]}, "include"),
    ],
)
def test_what_onelane_cannot_honour_is_refused_naming_the_field(client, extra, param):
    body = {"model": MODEL, "input": "hi", **extra}
    with pytest.raises(openai.BadRequestError) as refused:
        client.post("/responses", body=body, cast_to=object)
    assert refused.value.body["param"] == param, refused.value.body  # type: ignore[index]


def test_a_foreground_stream_whose_client_hangs_up_has_its_response_cancelled(live_server, worker, store):
    # Given a foreground response streaming
    body = {"model": MODEL, "input": "on and on", "stream": True, "max_output_tokens": BUSY, "ignore_eos": True}
    with requests.post(f"{live_server}/v1/responses", json=body, stream=True, timeout=30) as answer:
        job_id = answer.headers["x-onelane-job-id"]
        lines = answer.iter_lines()
        while b"response.output_text.delta" not in next(lines):
            pass
    # When its client hangs up, Then its job ends cancelled, as the client's leaving
    done = wait_ended(store, job_id)
    assert done["status"] == "cancelled" and done["error"]["type"] == "client_gone"


def test_a_background_stream_whose_client_hangs_up_runs_on(live_server, worker, store):
    body = {
        "model": MODEL,
        "input": "on",
        "stream": True,
        "background": True,
        "max_output_tokens": 30,
        "ignore_eos": True,
    }
    with requests.post(f"{live_server}/v1/responses", json=body, stream=True, timeout=30) as answer:
        job_id = answer.headers["x-onelane-job-id"]
        next(answer.iter_lines())
    assert wait_ended(store, job_id)["status"] == "completed"


def test_a_background_response_that_waits_past_its_ttl_is_failed_expired(make_app, settings, store):
    # Given no worker and a one-second TTL, When a background response waits past it
    client = make_app(settings.model_copy(update={"job_ttl_s": 1})).test_client()
    created = client.post("/v1/responses", json={"model": MODEL, "input": "hi", "background": True}).get_json()
    wait_ended(store, job_of(created["id"]))  # the web's housekeeping expires it

    # Then it reads as failed, code `expired`, with nothing written, and its stream ends with response.failed
    done = client.get(f"/v1/responses/{created['id']}").get_json()
    assert (done["status"], done["error"]["code"], done["output"]) == ("failed", "expired", [])
    assert done["usage"]["output_tokens"] == 0
    stream = client.get(f"/v1/responses/{created['id']}?stream=true").get_data(as_text=True)
    assert stream.rstrip().splitlines()[-2] == "event: response.failed"


def test_a_request_shaped_as_codex_cli_sends_it_is_answered(live_server, worker):
    """What Codex CLI 0.171.0 sends on every turn (read from the wire, its prompt cut short; its hosted web search
    and tool namespaces turned off in its config, as onelane runs no hosted tool): reasoning with a summary asked
    for, its encrypted content included, store false, a prompt cache key, its own client metadata, strict function
    tools, developer messages, streamed."""
    body = {
        "model": MODEL,
        "stream": True,
        "store": False,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "01a22483-d235-75f1-af38-9ba5b934dc87",
        "client_metadata": {"session_id": "s", "x-codex-turn-metadata": json.dumps({"turn_id": "t", "model": MODEL})},
        "tools": [
            {
                "type": "function",
                "name": "exec_command",
                "description": "Runs a command",
                "strict": False,
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
            }
        ],
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files here"}]},
        ],
        "max_output_tokens": 16,
    }
    with requests.post(f"{live_server}/v1/responses", json=body, stream=True, timeout=60) as answer:
        assert answer.status_code == 200, answer.text
        events = [line.decode().removeprefix("event: ") for line in answer.iter_lines() if line.startswith(b"event: ")]
    assert events[0] == "response.created" and events[-1] in ("response.completed", "response.incomplete")
    assert not any("reasoning" in e for e in events)  # no reasoning is made
