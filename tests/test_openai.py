"""Code written for the OpenAI API works against onelane unchanged, with the official SDK as the client."""

from __future__ import annotations

import json
import threading

import openai
import pytest
import requests

from tasks.catalogue import DEFAULT_MODEL
from tasks.job import JobStatus
from tasks.store import Delivered
from tests.helpers import BUSY, DEMO, claim_now, wait_ended, wait_event

MODEL = DEMO
pytestmark = pytest.mark.default_catalog


@pytest.fixture
def worker(start_worker, settings, engine):  # type: ignore[no-untyped-def]
    return start_worker()


def chat(client, content="hi", **kw):  # type: ignore[no-untyped-def]
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)


def raw_stream(client, content: str, max_tokens: int, **kw):  # type: ignore[no-untyped-def]
    """A chat stream of exactly `max_tokens` tokens, with its raw response (its headers name the job)."""
    messages = [{"role": "user", "content": content}]
    create = client.chat.completions.with_raw_response.create
    return create(
        model=MODEL, messages=messages, max_tokens=max_tokens, stream=True, extra_body={"ignore_eos": True}, **kw
    )


def test_models_lists_the_served_models(client):
    # the default catalog: the default real model first, then the demo model
    assert [m.id for m in client.models.list()] == [DEFAULT_MODEL, MODEL]


def test_chat_completion(client, worker, store):
    response = chat(client, max_tokens=6, extra_body={"ignore_eos": True})

    assert response.object == "chat.completion"
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 6
    job = store.list("local")[0]
    assert response.choices[0].message.content == job.output


def test_completion(client, worker):
    response = client.completions.create(model=MODEL, prompt="once upon", max_tokens=5, extra_body={"ignore_eos": True})
    assert response.object == "text_completion"
    assert response.choices[0].text and response.usage.completion_tokens == 5


def test_stream_has_content_deltas_then_done_and_usage(client, worker, store):
    raw = raw_stream(client, "hi", 12, stream_options={"include_usage": True})
    job_id = raw.headers["x-onelane-job-id"]
    chunks = list(raw.parse())

    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == store.get(job_id).output
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_raw_stream_ends_with_done(live_server, worker):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 3, "stream": True}
    lines = [ln for ln in requests.post(f"{live_server}/v1/completions", json=body, timeout=30).text.splitlines() if ln]
    assert lines[-1] == "data: [DONE]"
    assert all(ln.startswith(("data: ", ":")) for ln in lines)


def test_max_tokens_gives_finish_reason_length(client, worker):
    response = chat(client, max_completion_tokens=3, extra_body={"ignore_eos": True})
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 3


def test_a_stop_string_ends_the_answer_before_it(client, worker):
    free = chat(client, "stop", max_tokens=20, temperature=0, extra_body={"ignore_eos": True})
    text = free.choices[0].message.content
    stop = text[len(text) // 2 : len(text) // 2 + 2]

    stopped = chat(client, "stop", max_tokens=20, temperature=0, stop=[stop], extra_body={"ignore_eos": True})

    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[: text.index(stop)]


@pytest.mark.parametrize(
    "extra",
    [
        {"functions": [{"name": "f"}]},  # (the legacy form of tools)
        {"echo": True},  # (the legacy completions': chat takes only its neutral value)
        {"store": True},
    ],
)
def test_unsupported_parameter_is_a_bad_request(client, extra, store):
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, extra_body=extra)
    assert err.value.body["param"] == next(iter(extra))
    assert err.value.body["type"] == "invalid_request_error"
    assert store.list("local") == []


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert err.value.body["code"] == "model_not_found"


def test_headers_carry_the_job_id_and_queue_time(client, worker, store):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2
    )
    assert store.get(raw.headers["x-onelane-job-id"]).status.value == "completed"
    assert float(raw.headers["x-queue-time"]) >= 0


def test_a_waiting_stream_gets_its_position_as_comments(live_server, jobs, store, worker):
    busy = jobs.submit("busy", max_tokens=BUSY, ignore_eos=True)
    wait_event(store, busy["id"], lambda e: e.type == "token")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": True}
    with requests.post(f"{live_server}/v1/chat/completions", json=body, stream=True, timeout=30) as response:
        lines = response.iter_lines(decode_unicode=True)
        comment = next(ln for ln in lines if ln.startswith(":"))
        jobs.cancel(busy["id"])
        rest = [ln for ln in lines if ln]
    assert comment.startswith(": queued, position 1")
    assert rest[-1] == "data: [DONE]"


def test_closing_a_stream_cancels_its_job(client, worker, store):
    stream = raw_stream(client, "x", 3000)
    job_id = stream.headers["x-onelane-job-id"]
    chunks = stream.parse()
    for _, _ in zip(range(5), chunks):
        pass
    chunks.close()

    done = wait_ended(store, job_id)
    assert done["status"] == "cancelled"
    assert done["error"]["type"] == "client_gone"
    assert 0 < done["usage"]["completion_tokens"] < 3000


def test_a_non_streaming_client_that_leaves_while_queued_is_never_generated(live_server, jobs, store, worker):
    busy = jobs.submit("busy", max_tokens=BUSY, ignore_eos=True)
    wait_event(store, busy["id"], lambda e: e.type == "token")
    impatient = openai.OpenAI(base_url=f"{live_server}/v1", api_key="x", max_retries=0, timeout=1.0)

    gave_up = threading.Event()

    def ask() -> None:
        try:
            chat(impatient, max_tokens=5)
        except openai.APITimeoutError:
            gave_up.set()

    thread = threading.Thread(target=ask)
    thread.start()
    thread.join()
    assert gave_up.is_set()
    job_id = next(j.id for j in store.list("local") if j.id != busy["id"])

    left = wait_ended(store, job_id)
    jobs.cancel(busy["id"])

    assert left["status"] == "cancelled"
    assert left["error"]["type"] == "client_gone"
    assert left["timings"]["started_at"] is None and left["usage"]["completion_tokens"] == 0


def test_a_stream_whose_worker_died_mid_answer_goes_on_where_it_was(live_server, store):
    # Given a streamed chat whose worker (played by this test) wrote half an answer, then died
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 50, "stream": True}
    with requests.post(f"{live_server}/v1/chat/completions", json=body, stream=True, timeout=30) as response:
        job_id = response.headers["x-onelane-job-id"]
        lines = response.iter_lines(decode_unicode=True)
        worker = store.for_worker("w")
        assert worker.take_device() == "ok"
        assert claim_now(store, "w").id == job_id
        worker.append(job_id, (11, 12, 13), "half an answer", 1)
        next(ln for ln in lines if "half an answer" in ln)
        worker.hand_back(job_id)

        # When its next run claims it, Then it is told what the first generated, and writes only what follows
        claim = worker.claim_next(want="*")
        assert claim.delivered == Delivered((11, 12, 13), "half an answer")  # type: ignore[union-attr]
        worker.append(job_id, (14, 15), ", and the rest", 1, start=(3, len(b"half an answer")))
        worker.finish(job_id, JobStatus.COMPLETED, finish_reason="stop", completion_tokens=5)
        rest = [ln.removeprefix("data: ") for ln in lines if ln.startswith("data: ")]
    chunks = [json.loads(ln) for ln in rest if ln != "[DONE]"]

    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == ", and the rest"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and rest[-1] == "[DONE]"
    done = wait_ended(store, job_id)
    assert (done["status"], done["output"], done["attempts"]) == ("completed", "half an answer, and the rest", 2)
    assert done["usage"]["completion_tokens"] == 5


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
LOOSE = [  # each is refused by OpenAI: a value of the wrong JSON type is not converted
    ("max_tokens true", {"max_tokens": True}, "max_tokens"),
    ("max_tokens a float", {"max_tokens": 8.0}, "max_tokens"),
    ("max_tokens a string", {"max_tokens": "8"}, "max_tokens"),
    ("max_completion_tokens true", {"max_completion_tokens": True}, "max_completion_tokens"),
    ("temperature a string", {"temperature": "0.5"}, "temperature"),
    ("temperature true", {"temperature": True}, "temperature"),
    ("top_p a string", {"top_p": "1"}, "top_p"),
    ("seed true", {"seed": True}, "seed"),
    ("seed a float", {"seed": 1.0}, "seed"),
    ("stream a string", {"stream": "true"}, "stream"),
    ("stream 1", {"stream": 1}, "stream"),
    ("stream_options.include_usage 1", {"stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    ("stop a number", {"stop": 5}, "stop"),
    ("user a number", {"user": 7}, "user"),
    ("ignore_eos 1", {"ignore_eos": 1}, "ignore_eos"),
    ("model a number", {"model": 1}, "model"),
    ("n true", {"n": True}, "n"),
    ("n 1.0", {"n": 1.0}, "n"),
    ("logprobs 0", {"logprobs": 0}, "logprobs"),
    ("presence_penalty false", {"presence_penalty": False}, "presence_penalty"),
    ("content a number", {"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    (
        "a text part a number",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        "messages.0.content",
    ),
    ("name a number", {"messages": [{"role": "user", "content": "x", "name": 5}]}, "messages.0.name"),
    ("an integer beyond any float", {"temperature": 10**400}, "temperature"),
    ("empty content", {"messages": [{"role": "user", "content": ""}]}, "messages"),
    ("no content", {"messages": [{"role": "user", "content": None}]}, "messages"),
]


@pytest.mark.parametrize("name,fields,param", LOOSE, ids=[row[0] for row in LOOSE])
def test_a_value_of_the_wrong_type_is_a_bad_request_naming_it(jobs, store, name, fields, param):
    response = jobs.client.post("/v1/chat/completions", json={**CHAT, **fields})

    assert response.status_code == 400, response.get_json()
    error = response.get_json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert store.list("local") == []


def test_numbers_of_either_kind_are_taken_where_openai_takes_them(jobs, store):
    body = {
        **CHAT,
        "temperature": 1,
        "top_p": 1,
        "n": 1,
        "presence_penalty": 0.0,
        "frequency_penalty": 0,
        "stream": True,
    }

    response = jobs.client.post("/v1/chat/completions", json=body)  # streams: nothing is read, nothing waits

    assert response.status_code == 200
    job = store.get(response.headers["x-onelane-job-id"])
    assert job.spec.params.temperature == 1.0 and job.spec.params.top_p == 1.0
    response.close()  # the client left: its job is cancelled


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/completions", {"model": MODEL, "prompt": ""}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": [""]}, "prompt"),
        (
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [
                    {"role": "system", "content": ""},
                    {"role": "user", "content": [{"type": "text", "text": ""}]},
                ],
            },
            "messages",
        ),
    ],
)
def test_an_empty_prompt_is_a_bad_request(jobs, store, path, body, param):
    response = jobs.client.post(path, json=body)

    assert response.status_code == 400
    assert response.get_json()["error"]["param"] == param
    assert store.list("local") == []


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/completions", b'{"model": "onelane-demo", "prompt": "\\ud800"}'),
        ("/v1/completions", b'{"model": "onelane-demo", "prompt": "a", "stop": "\\udfff"}'),
        ("/v1/chat/completions", b'{"model": "onelane-demo", "messages": [{"role": "user", "content": "\\ud800"}]}'),
        (
            "/v1/chat/completions",
            b'{"model": "onelane-demo", "messages": [{"role": "user", "content": "a"}], "user": "\\ud800"}',
        ),
        ("/v1/chat/completions", b"[" * 100_000),
    ],
)
def test_text_that_is_not_unicode_or_json_nested_too_deep_is_a_bad_request(jobs, store, path, body):
    response = jobs.client.post(path, data=body, content_type="application/json")

    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "invalid_json"
    assert store.list("local") == []
