"""Structured output and function tools on the Responses API, on the default model, through the official SDK
unchanged: `text.format` makes the answer JSON of its schema, and `tools` make it calls, each an output item of its
own, whose arguments validate (whole, and streamed as OpenAI's events); a call's output goes back to the model as
the next turn's input, by `previous_response_id` or with the items sent back."""

from __future__ import annotations

import json
import time

import jsonschema
import openai
import pytest

from tasks import keys
from tests.test_structured import TIME as CHAT_TIME
from tests.test_structured import WEATHER as CHAT_WEATHER
from tests.test_structured import Person

pytestmark = [pytest.mark.timeout(300), pytest.mark.default_model]  # the stories run on SmolLM2 (conftest.py)


# the chat stories' tools, in the Responses API's flat shape
WEATHER = {"type": "function", **CHAT_WEATHER["function"], "strict": True}
TIME = {"type": "function", **CHAT_TIME["function"]}
ASK = "What is the weather in Paris?"
SUNNY = '{"temperature": 21, "sky": "sunny"}'


def job_of(response_id: str) -> str:
    return "job_" + response_id.removeprefix("resp_")


def validates(call) -> None:  # type: ignore[no-untyped-def]
    tool = next(t for t in (WEATHER, TIME) if t["name"] == call.name)
    jsonschema.validate(json.loads(call.arguments), tool["parameters"])


def conforms(app, path: str, name: str) -> None:  # type: ignore[no-untyped-def]
    """What `path` answers (each event, if a stream) is what /openapi.json calls a `name`."""
    web = app.test_client()
    schema = {"$ref": f"#/components/schemas/{name}", "components": web.get("/openapi.json").get_json()["components"]}
    answer = web.get(path)
    assert answer.status_code == 200
    lines = answer.get_data(as_text=True).splitlines()
    bodies = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    for body in bodies if answer.mimetype == "text/event-stream" else [answer.get_json()]:
        jsonschema.validate(body, schema)


def test_parse_with_a_pydantic_model_gives_output_parsed_and_json_object_gives_an_object(
    app, client, start_worker, model
):
    start_worker()
    parsed = client.responses.parse(
        model=model,
        input="Invent a person who lives in Tokyo.",
        text_format=Person,
        temperature=0,
        max_output_tokens=60,
    )
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Person)
    assert Person.model_validate_json(parsed.output_text) == parsed.output_parsed
    echoed = client.responses.retrieve(parsed.id).text.format  # as the request gave it, read back from the job
    assert (echoed.type, echoed.name, echoed.strict, echoed.schema_) == (
        "json_schema",
        "Person",
        True,
        parsed.text.format.schema_,
    )
    conforms(app, f"/v1/responses/{parsed.id}", "OpenAIResponse")

    whole = client.responses.create(
        model=model,
        input="Name one fruit, as a JSON object.",
        text={"format": {"type": "json_object"}},
        temperature=0,
        max_output_tokens=50,
    )
    assert whole.text.format.type == "json_object" and isinstance(json.loads(whole.output_text), dict)


def test_a_required_tool_gives_calls_that_validate_whole_and_streamed_and_a_replay_is_numbered_the_same(
    app, client, start_worker, model
):
    start_worker()
    ask = {"model": model, "input": ASK, "tools": [WEATHER, TIME], "tool_choice": "required", "temperature": 0}
    whole = client.responses.create(**ask, max_output_tokens=100)
    assert whole.status == "completed" and whole.output and {item.type for item in whole.output} == {"function_call"}
    for call in whole.output:
        validates(call)
        assert call.status == "completed" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert (whole.tool_choice, [t.name for t in whole.tools], whole.tools[0].strict) == (
        "required",
        ["get_weather", "get_time"],
        True,
    )

    with client.responses.stream(**ask, max_output_tokens=100) as stream:
        events = list(stream)
        final = stream.get_final_response()
    calls: dict[int, dict[str, str]] = {}
    for event in events:
        if event.type == "response.output_item.added":
            assert event.item.type == "function_call" and event.item.arguments == ""
            calls[event.output_index] = {"name": event.item.name, "arguments": ""}
        elif event.type == "response.function_call_arguments.delta":
            calls[event.output_index]["arguments"] += event.delta
        elif event.type == "response.function_call_arguments.done":
            assert event.arguments == calls[event.output_index]["arguments"]
    assert [calls[i] for i in sorted(calls)] == [{"name": c.name, "arguments": c.arguments} for c in whole.output]
    assert [(c.name, c.arguments, c.status) for c in final.output] == [
        (c.name, c.arguments, "completed") for c in whole.output
    ]
    assert events[-1].type == "response.completed"

    # the stream is a function of the job's log: read again, whole or after any event, it is numbered the same
    told = [(e.sequence_number, e.type) for e in events]
    again = [(e.sequence_number, e.type) for e in client.responses.retrieve(final.id, stream=True)]
    assert again == told
    cut = told[len(told) // 2][0]
    rest = client.responses.retrieve(final.id, stream=True, starting_after=cut)
    assert [(e.sequence_number, e.type) for e in rest] == told[cut + 1 :]
    conforms(app, f"/v1/responses/{final.id}", "OpenAIResponse")
    conforms(app, f"/v1/responses/{final.id}?stream=true", "ResponseStreamEvent")


def test_a_function_call_output_is_answered_by_previous_response_id_and_with_the_items_sent_back(
    app, client, start_worker, model, store
):
    start_worker()
    named = {"type": "function", "name": "get_weather"}
    first = client.responses.create(
        model=model, input=ASK, tools=[WEATHER, TIME], tool_choice=named, temperature=0, max_output_tokens=40
    )
    call = first.output[0]
    validates(call)
    assert {c.name for c in first.output} == {"get_weather"} and first.tool_choice.name == "get_weather"
    result = {"type": "function_call_output", "call_id": call.call_id, "output": SUNNY}
    follow = {"model": model, "tools": [WEATHER], "temperature": 0, "max_output_tokens": 12}

    # by previous_response_id: the response's calls are carried on, and this input answers one
    second = client.responses.create(**follow, previous_response_id=first.id, input=[result])
    # with the items sent back: the question, the response's output as it came, the call's output
    third = client.responses.create(**follow, input=[{"role": "user", "content": ASK}, *first.output, result])

    for answer in (second, third):
        assert answer.status in ("completed", "incomplete") and answer.output
    turns = [store.get(job_of(r.id)).spec.messages for r in (second, third)]
    assert turns[0] == turns[1]
    assert [(m.role, m.tool_call_id) for m in turns[0]] == [("user", None), ("assistant", None), ("tool", call.call_id)]
    made = [(c.call_id, c.name, c.arguments) for c in first.output]
    assert [(c.id, c.name, c.arguments) for c in turns[0][1].tool_calls] == made
    items = client.responses.input_items.list(second.id, order="asc").data
    assert [item.type for item in items] == ["message", *["function_call"] * len(made), "function_call_output"]
    assert [(item.call_id, item.name, item.arguments) for item in items[1:-1]] == made
    assert (items[-1].call_id, items[-1].output) == (call.call_id, SUNNY)
    conforms(app, f"/v1/responses/{second.id}/input_items", "InputItemList")


@pytest.mark.parametrize(
    "extra, param, named",
    [
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "objekt"}}}},
            "text.format",
            "objekt",
        ),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"if": {}}}}}, "text.format", "if"),
        ({"tools": [{**WEATHER, "parameters": {"type": "objekt"}}]}, "tools[0].parameters", "objekt"),
        ({"tools": [WEATHER, {"type": "web_search"}, {"type": "file_search"}]}, "tools", "file_search, web_search"),
        ({"tools": [WEATHER], "text": {"format": {"type": "json_object"}}}, "text.format", "tools"),
        ({"tool_choice": "required"}, "tool_choice", "tools"),
    ],
)
def test_what_cannot_be_enforced_is_a_400_naming_it_at_once_and_no_job_is_made(
    client, store, model, extra, param, named
):
    started = time.perf_counter()
    with pytest.raises(openai.BadRequestError) as refused:
        client.post("/responses", body={"model": model, "input": ASK, **extra}, cast_to=object)
    assert time.perf_counter() - started < 1.0
    body = refused.value.body
    assert named in body["message"] and body["param"].startswith(param), body  # type: ignore[index]
    assert store.redis.zcard(keys.QUEUE) == 0 and not list(store.redis.scan_iter(keys.job("*")))
