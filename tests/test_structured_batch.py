"""A constrained answer in the continuous batch: its mask is its own (alone or among others, it writes the same), its
forced tokens are fast-forwarded without changing a token, and a worker killed mid-answer loses nothing: the next run
takes up the grammar where the tokens written left it."""

from __future__ import annotations

import json
import os
import signal
import threading

import jsonschema
import pytest
import requests

from bench.harness import generate
from tasks.job import JobSpec, Message, SamplingParams
from tasks.structured import json_constraint
from tests.helpers import wait_ended, wait_event
from tests.test_recovery import wait_for_worker

# the stories run on SmolLM2 (conftest.py)
pytestmark = [pytest.mark.timeout(300), pytest.mark.default_model, pytest.mark.slow_file]

ORDER = {
    "type": "object",
    "properties": {
        "the_customer_full_legal_name": {"type": "string", "maxLength": 24},
        "the_customer_primary_email_address": {"type": "string", "maxLength": 24},
        "the_number_of_items_in_the_order": {"type": "integer", "minimum": 1, "maximum": 99},
    },
    "required": [
        "the_customer_full_legal_name",
        "the_customer_primary_email_address",
        "the_number_of_items_in_the_order",
    ],
    "additionalProperties": False,
}
LIST = {
    "type": "object",
    "properties": {"things": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 10}},
    "required": ["things"],
    "additionalProperties": False,
}
ASK = "Write the order of Ann Lee, who bought three books, as JSON."


def spec(text: str, schema: dict, **params) -> JobSpec:  # type: ignore[type-arg, no-untyped-def]
    return JobSpec(
        owner="t",
        model="m",
        messages=(Message(role="user", content=text),),
        params=SamplingParams(**params),
        constraint=json_constraint(schema, "response_format"),
    )


def alone(engine, job: JobSpec) -> str:  # type: ignore[no-untyped-def]
    return "".join(chunk.text for chunk in generate(engine, job))


def chat(base_url: str, model: str, text: str, schema: dict | None, **params) -> dict:  # type: ignore[type-arg, no-untyped-def]
    body = {"model": model, "messages": [{"role": "user", "content": text}], **params}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    return requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=120).json()


def test_a_constrained_greedy_answer_is_the_same_alone_and_in_a_full_batch(live_server, settings, start_worker, engine):
    # Given the answer a constrained greedy job gives alone, drawn token by token under its mask
    expected = alone(engine, spec(ASK, ORDER, max_tokens=80))
    jsonschema.validate(json.loads(expected), ORDER)

    # When it runs among 7 others: constrained ones of another schema, and free ones, greedy and sampled
    start_worker()
    answers: dict[int, dict] = {}  # type: ignore[type-arg]
    asks = [(ASK, ORDER, {"temperature": 0})]
    asks += [(f"List {n} animals.", LIST, {"temperature": 0.8, "seed": n}) for n in range(3)]
    asks += [(f"Tell me about the number {n}.", None, {"temperature": 0.9 if n % 2 else 0}) for n in range(4)]

    def run(i: int, text: str, schema: dict | None, params: dict) -> None:  # type: ignore[type-arg]
        answers[i] = chat(live_server, settings.model_name, text, schema, max_tokens=80, **params)

    threads = [threading.Thread(target=run, args=(i, *a)) for i, a in enumerate(asks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # Then it writes the same; every constrained answer that completed validates; the free ones stayed free
    assert answers[0]["choices"][0]["message"]["content"] == expected
    for i in (1, 2, 3):
        choice = answers[i]["choices"][0]
        if choice["finish_reason"] == "stop":
            jsonschema.validate(json.loads(choice["message"]["content"]), LIST)
    assert not any(answers[i]["choices"][0]["message"]["content"].startswith('{"things"') for i in range(4, 8))


def test_forced_tokens_are_fast_forwarded_and_change_no_token(engine, start_worker, live_server, settings, store):
    # Given the answer to a schema of long fixed keys, with fast-forward off
    worker = start_worker(fast_forward=0)
    slow = chat(live_server, settings.model_name, ASK, ORDER, max_tokens=80, temperature=0)
    steps_slow = engine.counters.steps
    worker.stop()

    # When fast-forward is on
    start_worker()
    fast = chat(live_server, settings.model_name, ASK, ORDER, max_tokens=80, temperature=0)
    steps_fast = engine.counters.steps - steps_slow

    # Then the answer is the same, token for token, in fewer steps (the keys were read, not drawn)
    assert fast["choices"][0]["message"]["content"] == slow["choices"][0]["message"]["content"]
    assert fast["usage"]["completion_tokens"] == slow["usage"]["completion_tokens"]
    assert steps_fast < steps_slow - 20, (steps_fast, steps_slow)
    jsonschema.validate(json.loads(fast["choices"][0]["message"]["content"]), ORDER)


@pytest.mark.parametrize(
    "schema",
    [
        {"const": {"foo": "bar", "baz": "bax"}},  # forced whole, from the first token
        {
            "type": "object",
            "properties": {"n": {"type": "integer"}, "kind": {"const": "an_order_confirmation"}},
            "required": ["n", "kind"],
            "additionalProperties": False,
        },  # forced from the number on, to the end
    ],
    ids=["const", "ends with a const"],
)
def test_an_answer_whose_rest_is_all_forced_is_written_whole(schema, live_server, settings, start_worker):
    start_worker()
    answer = chat(live_server, settings.model_name, "Answer in JSON.", schema, max_tokens=60, temperature=0)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), schema)


def test_a_worker_killed_mid_answer_leaves_a_valid_answer_and_a_stream_without_gap_or_repeat(
    live_server, store, settings, worker_process
):
    worker_process()
    body = {
        "model": settings.model_name,
        "messages": [{"role": "user", "content": "List things in a kitchen."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "l", "schema": LIST}},
        "max_tokens": 120,
        "temperature": 0.8,
        "seed": 3,
        "stream": True,
    }
    with requests.post(f"{live_server}/v1/chat/completions", json=body, stream=True, timeout=120) as response:
        job_id = response.headers["x-onelane-job-id"]
        # (the worker's start and its model's load come first: a whole minute beside two busy processes once)
        wait_event(store, job_id, lambda e: e.type == "token" and e.index >= 10, timeout_s=150)
        os.kill(wait_for_worker(store).pid, signal.SIGKILL)
        lines = [ln.removeprefix("data: ") for ln in response.iter_lines(decode_unicode=True) if ln.startswith("data")]

    chunks = [json.loads(ln) for ln in lines[:-1]]
    assert lines[-1] == "[DONE]" and not [c for c in chunks if "error" in c]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    done = wait_ended(store, job_id, timeout_s=90)
    assert (done["status"], done["attempts"], done["finish_reason"]) == ("completed", 2, "stop")
    assert streamed == done["output"]
    jsonschema.validate(json.loads(streamed), LIST)
