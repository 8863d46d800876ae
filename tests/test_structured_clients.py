"""Structured output through every other way in, on the default model: a job's `response_format`, `onelane run
--schema`, a batch's lines, LangChain unchanged, and the OpenAPI document that tells it all (with answers that keep
its promises). Schemas are small, most of their tokens forced: the stories stay quick on a CPU."""

from __future__ import annotations

import inspect
import io
import json
from typing import Any, Literal

import jsonschema
import pytest
import schemathesis
from pydantic import BaseModel, ConfigDict, Field

from tasks import keys
from tasks.store import Store
from tasks.structured import json_constraint
from tests.helpers import chat_line, wait_batch, wait_ended
from tests.test_client import job_id_in, onelane
from tests.test_openapi import CHECKS, STREAM_S

pytestmark = [pytest.mark.timeout(300), pytest.mark.default_model]  # the stories run on SmolLM2 (conftest.py)

RESIDENT = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "London", "Tokyo"]}, "age": {"type": "integer", "maximum": 120}},
    "required": ["city", "age"],
    "additionalProperties": False,
}
INVENT = "Invent a person who lives in Tokyo."
ASK = "What is the weather in Paris?"


class Person(BaseModel):
    """A person and the city they live in."""

    model_config = ConfigDict(extra="forbid")  # (additionalProperties false: a small model writes no more keys)

    name: str = Field(max_length=12)
    city: Literal["Paris", "London", "Tokyo"]


class GetWeather(BaseModel):
    """The weather in a city now."""

    model_config = ConfigDict(extra="forbid")

    city: Literal["Paris", "London", "Tokyo"]
    unit: Literal["celsius", "fahrenheit"]


def json_schema(schema: Any, name: str = "resident") -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


# --- a job's response_format, and `onelane run --schema` --------------------------------------------------------


def test_a_job_with_a_json_schema_answers_json_of_it_as_text(jobs, store: Store, start_worker):
    start_worker()

    job = jobs.submit(INVENT, response_format=json_schema(RESIDENT), max_tokens=30)
    anything = jobs.submit(INVENT, response_format={"type": "json_object"})

    ended = wait_ended(store, job["id"])
    assert ended["status"] == "completed" and ended["finish_reason"] == "stop"
    jsonschema.validate(json.loads(ended["output"]), RESIDENT)
    assert store.get(anything["id"]).spec.constraint == json_constraint(None, "response_format")  # any object


def test_a_job_with_a_schema_that_cannot_be_enforced_is_refused_naming_it_and_nothing_is_queued(jobs, store: Store):
    for schema, named in (({"type": "objekt"}, "objekt"), ({"type": "object", "if": {"type": "string"}}, "if")):
        refused = jobs.submit("hi", expect=422, response_format=json_schema(schema))["error"]
        assert refused["type"] == "invalid_request" and named in refused["message"]
        assert refused["param"] == "response_format.json_schema.schema"
    missing = jobs.submit("hi", expect=422, response_format={"type": "json_schema"})["error"]
    assert missing["param"] == "response_format"
    assert store.redis.zcard(keys.QUEUE) == 0 and not list(store.redis.scan_iter(keys.job("*")))


def test_run_with_a_schema_file_prints_json_of_it(jobs, start_worker, live_server, tmp_path):
    start_worker()
    (tmp_path / "resident.json").write_text(json.dumps(RESIDENT))

    done = onelane(live_server, "run", INVENT, "--schema", str(tmp_path / "resident.json"), "--max-tokens", "30")

    assert done.returncode == 0, done.stderr
    jsonschema.validate(json.loads(done.stdout), RESIDENT)
    assert jobs.get(job_id_in(done.stderr))["output"] == done.stdout.removesuffix("\n")


def test_run_with_a_schema_file_that_is_not_one_says_so_in_one_line_and_exits_2(live_server, tmp_path):
    # (said before anything is sent)
    (tmp_path / "broken.json").write_text('{"type": ')
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "resident.json").write_text(json.dumps(RESIDENT))
    for args, said in [
        (["--schema", str(tmp_path / "nowhere.json")], "No such file or directory"),
        (["--schema", str(tmp_path / "broken.json")], "not a JSON file"),
        (["--schema", str(tmp_path / "list.json")], "a JSON schema is a JSON object"),
        (["--schema", str(tmp_path / "resident.json"), "--json-object"], "give one of them"),
    ]:
        done = onelane(live_server, "run", "hi", *args)
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert done.stderr.startswith("Error: ") and done.stderr.count("\n") == 1 and said in done.stderr


def test_run_with_a_schema_the_server_cannot_enforce_says_why_and_exits_1(live_server, tmp_path):
    (tmp_path / "odd.json").write_text(json.dumps({"type": "objekt"}))

    done = onelane(live_server, "run", "hi", "--schema", str(tmp_path / "odd.json"))

    assert done.returncode == 1 and "objekt" in done.stderr and "422 invalid_request" in done.stderr


# --- a batch's lines ----------------------------------------------------------------------------------------------


def test_a_batch_line_with_a_schema_answers_json_of_it_and_one_that_cannot_be_enforced_is_an_error_line(
    client, store: Store, start_worker, model
):
    lines = [
        chat_line("resident", INVENT, 30, model, response_format=json_schema(RESIDENT), ignore_eos=False),
        chat_line("odd", "hi", 4, model, response_format=json_schema({"type": "objekt"})),
    ]
    start_worker()

    source = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(*lines))), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_batch(store, batch.id)

    assert (done.status, done.completed, done.failed) == ("completed", 1, 1)
    (answer,) = read_lines(client, done.output_file_id)
    jsonschema.validate(json.loads(answer["response"]["body"]["choices"][0]["message"]["content"]), RESIDENT)
    (error,) = read_lines(client, done.error_file_id)
    assert error["custom_id"] == "odd" and error["error"]["code"] == "invalid_request"
    assert "objekt" in error["error"]["message"] and "(response_format.json_schema.schema)" in error["error"]["message"]


def jsonl(*lines: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def read_lines(client, file_id: str | None) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    assert file_id is not None
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


# --- LangChain, unchanged ------------------------------------------------------------------------------------------


@pytest.fixture
def chat_model(live_server, model):  # type: ignore[no-untyped-def]
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        base_url=f"{live_server}/v1", api_key="anything", model=model, temperature=0, max_tokens=60, max_retries=0
    )


@pytest.mark.parametrize("method", ["default", "function_calling"])
def test_langchain_structured_output_gives_a_model_instance(chat_model, start_worker, method):
    # (the default is json_schema: a strict response_format of the model's schema; function_calling: a tool it must
    # call, one call only)
    from langchain_openai import ChatOpenAI

    assert inspect.signature(ChatOpenAI.with_structured_output).parameters["method"].default == "json_schema"
    start_worker()
    structured = chat_model.with_structured_output(Person, **({} if method == "default" else {"method": method}))
    assert isinstance(structured.invoke(INVENT), Person)


def test_langchain_tools_give_calls_with_valid_arguments_and_a_tool_message_is_answered(chat_model, start_worker):
    from langchain_core.messages import HumanMessage, ToolMessage

    start_worker()
    asked = [HumanMessage(ASK)]
    called = chat_model.bind_tools([GetWeather], tool_choice="GetWeather", parallel_tool_calls=False).invoke(asked)
    (call,) = called.tool_calls
    assert call["name"] == "GetWeather" and GetWeather.model_validate(call["args"]) and not called.invalid_tool_calls

    result = ToolMessage('{"temperature": 21, "sky": "sunny"}', tool_call_id=call["id"])
    answer = chat_model.bind_tools([GetWeather]).invoke([*asked, called, result], max_tokens=8)
    assert answer.content or answer.tool_calls


def test_langchain_streamed_calls_add_up_to_valid_arguments(chat_model, start_worker):
    start_worker()
    whole = None
    for chunk in chat_model.bind_tools([GetWeather], tool_choice="any", parallel_tool_calls=False).stream(ASK):
        whole = chunk if whole is None else whole + chunk
    assert whole is not None and not whole.invalid_tool_calls
    (call,) = whole.tool_calls
    assert call["name"] == "GetWeather" and GetWeather.model_validate(call["args"])


# --- the OpenAPI document -----------------------------------------------------------------------------------------


def test_the_document_tells_structured_output_on_every_way_in(app):
    spec = app.test_client().get("/openapi.json").get_json()
    schemas = spec["components"]["schemas"]
    fmt = {"anyOf": [{"$ref": "#/components/schemas/ResponseFormat"}, {"type": "null"}]}
    for request in ("SubmitJob", "ChatRequest", "CompletionRequest"):
        assert fmt.items() <= schemas[request]["properties"]["response_format"].items(), request
    assert {"tools", "tool_choice", "parallel_tool_calls"} <= set(schemas["ChatRequest"]["properties"])
    assert {"json_object", "json_schema"} <= set(schemas["ResponseFormat"]["properties"]["type"]["enum"])

    message = schemas["AssistantMessage"]
    assert message["required"] == ["role", "content"] and "tool_calls" in message["properties"]
    assert {"type": "null"} in message["properties"]["content"]["anyOf"]
    assert "tool_calls" in schemas["Delta"]["properties"] and "content" not in schemas["Delta"].get("required", [])
    for choice in ("ChatChoice", "ChatChunkChoice"):
        assert "tool_calls" in json.dumps(schemas[choice]["properties"]["finish_reason"])

    chat = spec["paths"]["/v1/chat/completions"]["post"]
    assert "`tools`" not in chat["responses"]["400"]["description"].split("not support")[1]
    assert "tool_calls" in chat["description"] and "response_format" in spec["paths"]["/v1/jobs"]["post"]["description"]


def test_answers_with_tool_calls_and_json_keep_the_documents_promises(app, start_worker, model):
    # Given a worker, When chat answers with a tool call (whole and streamed) or words beside tools, and a job answers
    # JSON, Then every answer and chunk conforms to the document (tests/test_openapi.py fuzzes it without a worker)
    start_worker()
    document = schemathesis.openapi.from_wsgi("/openapi.json", app)
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": RESIDENT}}
    chat = {"model": model, "messages": [{"role": "user", "content": ASK}], "max_tokens": 60, "temperature": 0}
    chat |= {"tools": [weather], "tool_choice": "required", "parallel_tool_calls": False}
    asked = document["/v1/chat/completions"]["POST"]
    for body in (chat, {**chat, "stream": True, "stream_options": {"include_usage": True}}):
        answer = asked.Case(body=body).call_and_validate(checks=CHECKS, timeout=STREAM_S)
        assert answer.status_code == 200 and "tool_calls" in answer.text and not answer.stream_cut_short, answer.text
    words = {**chat, "tool_choice": "auto", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 3}
    assert asked.Case(body=words).call_and_validate(checks=CHECKS).status_code == 200

    job = {"prompt": INVENT, "max_tokens": 30, "response_format": json_schema(RESIDENT)}
    submitted = document["/v1/jobs"]["POST"].Case(body=job).call_and_validate(checks=CHECKS)
    assert submitted.status_code == 202, submitted.text
    wait_ended(app.extensions["onelane"].store, submitted.json()["id"])
    read = document["/v1/jobs/{job_id}"]["GET"].Case(path_parameters={"job_id": submitted.json()["id"]})
    assert read.call_and_validate(checks=CHECKS).status_code == 200
