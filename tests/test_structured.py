"""Structured output on the default model, through the official SDK unchanged: every answer that must be JSON is
JSON of its schema, and every tool call's arguments validate, because each token is drawn under its grammar's mask."""

from __future__ import annotations

import json
import time
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel

from tasks import keys

pytestmark = [pytest.mark.timeout(300), pytest.mark.default_model]  # the stories run on SmolLM2 (conftest.py)


class Person(BaseModel):
    name: str
    age: int
    city: Literal["Paris", "London", "Tokyo"]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 30}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_parse_with_a_pydantic_model_gives_parsed(client, start_worker, model):
    start_worker()
    completion = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Invent a person who lives in Tokyo."}],
        response_format=Person,
        temperature=0,
        max_tokens=60,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)
    assert Person.model_validate_json(choice.message.content) == choice.message.parsed


def test_json_object_gives_a_json_object_and_a_stream_gives_the_same(client, start_worker, model):
    start_worker()
    ask = {"model": model, "messages": [{"role": "user", "content": "List three fruits as JSON."}], "max_tokens": 80}
    whole = client.chat.completions.create(**ask, response_format={"type": "json_object"}, temperature=0)
    assert isinstance(json.loads(whole.choices[0].message.content), dict)
    stream = client.chat.completions.create(**ask, response_format={"type": "json_object"}, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == whole.choices[0].message.content


def test_max_tokens_cuts_a_long_answer_and_says_length(client, start_worker, model):
    start_worker()
    schema = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
    response = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Tell a long story."}],
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        max_tokens=5,
        temperature=0,
    )
    assert response.choices[0].finish_reason == "length" and response.usage.completion_tokens == 5


def test_an_invalid_schema_is_a_400_at_once_and_no_job_is_made(client, store, model):
    for schema, named in (({"type": "objekt"}, "objekt"), ({"type": "object", "if": {"type": "string"}}, "if")):
        started = time.perf_counter()
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model=model,
                messages=ASK,
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            )
        assert time.perf_counter() - started < 1.0
        assert named in refused.value.message and refused.value.body["param"].startswith("response_format")
    assert store.redis.zcard(keys.QUEUE) == 0 and not list(store.redis.scan_iter(keys.job("*")))


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_required_or_named_tool_gives_calls_that_validate_whole_and_streamed(client, start_worker, model, choice):
    start_worker()
    ask = {"model": model, "messages": ASK, "tools": [WEATHER, TIME], "tool_choice": choice, "temperature": 0}
    whole = client.chat.completions.create(**ask, max_tokens=80)
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls" and message.tool_calls
    for call in message.tool_calls:
        tool = next(t for t in (WEATHER, TIME) if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    if isinstance(choice, dict):
        assert {c.function.name for c in message.tool_calls} == {"get_weather"}

    calls: dict[int, dict[str, str]] = {}
    reasons = []
    for chunk in client.chat.completions.create(**ask, max_tokens=80, stream=True):
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += delta.id or ""
            call["name"] += delta.function.name or "" if delta.function else ""
            call["arguments"] += delta.function.arguments or "" if delta.function else ""
        reasons.append(chunk.choices[0].finish_reason)
    assert all(call.pop("id").startswith("call_") for call in calls.values())  # (each request's calls, its own ids)
    assert [calls[i] for i in sorted(calls)] == [
        {"name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls
    ]
    assert reasons[-1] == "tool_calls"


def test_a_tool_result_turn_is_answered(client, start_worker, model):
    start_worker()
    first = client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=60
    )
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'},
    ]
    answer = client.chat.completions.create(
        model=model, messages=history, tools=[WEATHER], temperature=0, max_tokens=40
    )
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert answer.choices[0].message.content or answer.choices[0].message.tool_calls
