"""Anthropic's Messages API through the official `anthropic` SDK, unchanged (issue 50): whole and streamed answers,
a tool_use -> tool_result -> answer round trip with inputs of the tool's schema, count_tokens, cache_control's
counts, Anthropic's error shape, and an overloaded queue the SDK retries on its own."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

pytestmark = pytest.mark.timeout(180)

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city now",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def sdk(live_server: str, key: str = "anything", **options: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live_server, api_key=key, max_retries=options.pop("max_retries", 0), **options)


def test_a_message_whole_and_streamed_is_the_same_answer_as_chats(start_worker, live_server, model, client):
    start_worker()
    messages = sdk(live_server)
    ask = {
        "model": model,
        "max_tokens": 24,
        "messages": ASK,
        "system": "You are terse.",
        "extra_body": {"temperature": 0},
    }
    whole = messages.messages.create(**ask)
    # the same job as chat completions would run for it (the system prompt first)
    chat = client.chat.completions.create(
        model=model, max_tokens=24, temperature=0, messages=[{"role": "system", "content": "You are terse."}, *ASK]
    )
    assert [b.type for b in whole.content] == ["text"]
    assert whole.content[0].text == chat.choices[0].message.content
    assert whole.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[chat.choices[0].finish_reason]
    assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert whole.usage.output_tokens == chat.usage.completion_tokens
    assert whole.id.startswith("msg_") and whole.role == "assistant" and whole.model == model

    with messages.messages.stream(**ask) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    # Anthropic's order: the message, each block opened, its deltas, closed, then the stop reason and the end
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    blocks = [k for k in kinds if k.startswith("content_block")]
    assert blocks[0] == "content_block_start" and blocks[-1] == "content_block_stop"
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == chat.usage.prompt_tokens


def test_a_tool_use_round_trip_with_inputs_of_the_tools_schema(start_worker, live_server, model):
    start_worker()
    messages = sdk(live_server)
    ask = {"model": model, "max_tokens": 120, "messages": ASK, "tools": [WEATHER], "extra_body": {"temperature": 0}}
    # the model must call (`any`): its input is JSON of the schema, enforced as it is generated
    called = messages.messages.create(**ask, tool_choice={"type": "any"})
    assert called.stop_reason == "tool_use"
    uses = [b for b in called.content if b.type == "tool_use"]
    assert uses and all(u.name == "get_weather" for u in uses)
    for use in uses:
        jsonschema.validate(use.input, WEATHER["input_schema"])
    # streamed: the call's input arrives as input_json_delta pieces, which the SDK assembles into the same input
    with messages.messages.stream(**ask, tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        pieces = [
            e.delta.partial_json
            for e in stream
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
        ]
        streamed = stream.get_final_message()
    use = next(b for b in streamed.content if b.type == "tool_use")
    assert json.loads("".join(pieces)) == use.input and streamed.stop_reason == "tool_use"
    jsonschema.validate(use.input, WEATHER["input_schema"])
    # the tool's result goes back as a tool_result block: the model answers in words (`none`: no more calls)
    history = [
        *ASK,
        {"role": "assistant", "content": [u.model_dump() for u in uses]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "18 C, clear"} for u in uses],
        },
    ]
    answer = messages.messages.create(**{**ask, "messages": history}, tool_choice={"type": "none"})
    assert [b.type for b in answer.content] == ["text"] and answer.stop_reason in ("end_turn", "max_tokens")


def test_count_tokens_is_the_prompt_a_message_reads(start_worker, live_server, model):
    start_worker()
    messages = sdk(live_server)
    ask = {"model": model, "messages": ASK, "tools": [WEATHER], "system": "You are terse."}
    counted = messages.messages.count_tokens(**ask)
    answer = messages.messages.create(**ask, max_tokens=4, extra_body={"temperature": 0})
    u = answer.usage
    assert counted.input_tokens == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens > 20


def test_cache_control_reports_what_was_written_then_read(start_worker, live_server, model):
    start_worker()
    messages = sdk(live_server)
    system = [{"type": "text", "text": "You are a careful assistant. " * 20, "cache_control": {"type": "ephemeral"}}]
    first = messages.messages.create(
        model=model, max_tokens=8, extra_body={"temperature": 0}, system=system, messages=ASK
    )
    assert first.usage.cache_read_input_tokens == 0
    assert first.usage.cache_creation_input_tokens > 100 and first.usage.input_tokens == 0
    follow = [*ASK, {"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "And Rome?"}]
    second = messages.messages.create(
        model=model, max_tokens=8, extra_body={"temperature": 0}, system=system, messages=follow
    )
    # the conversation so far was read from the worker's prefix cache
    assert second.usage.cache_read_input_tokens >= first.usage.cache_creation_input_tokens
    # unmarked, the same counts are input
    plain = messages.messages.create(
        model=model, max_tokens=8, extra_body={"temperature": 0}, system="x " * 50, messages=ASK
    )
    assert plain.usage.cache_creation_input_tokens == 0 and plain.usage.input_tokens > 0


def test_errors_come_in_anthropics_shape_naming_what_is_not_honored(live_server, model):
    messages = sdk(live_server)
    with pytest.raises(anthropic.BadRequestError) as err:
        messages.messages.create(
            model=model, max_tokens=8, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1024}
        )
    assert err.value.status_code == 400
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    assert "thinking of type 'enabled' is not supported" in err.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as missing:
        messages.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=ASK)
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        messages.messages.create(model=model, max_tokens=8, messages=[{"role": "assistant", "content": [
            {"type": "tool_result", "tool_use_id": "x", "content": "y"}]}])  # fmt: skip
    assert "assistant's turn" in bad.value.body["error"]["message"]
    # a disabled thinking is what onelane does anyway: let through (no worker: it waits, and is cancelled)
    body = {"model": model, "max_tokens": 8, "messages": ASK, "thinking": {"type": "disabled"}, "stream": True}
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", f"{live_server}/v1/messages", json=body, headers=headers, timeout=30) as reply:
        assert reply.status_code == 200 and next(reply.iter_lines()) == "event: message_start"


def test_thinking_shown_as_updates_is_answered_as_no_thinking_is(live_server, model):
    """Claude Code 2.1.332 with `--output-format stream-json` asks to see thinking as `updates` (refused, it asked
    twice, then again without it: three round trips a turn). These models never think: there is nothing to show."""
    body = {"model": model, "max_tokens": 8, "messages": ASK, "stream": True}
    body["thinking"] = {"type": "adaptive", "display": "updates"}
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    # (no worker: it waits, and is cancelled as the stream closes)
    with httpx.stream("POST", f"{live_server}/v1/messages?beta=true", json=body, headers=headers, timeout=30) as reply:
        assert reply.status_code == 200 and next(reply.iter_lines()) == "event: message_start"
    # a display that Anthropic does not define is still refused by name
    body["thinking"]["display"] = "everything"
    refused = httpx.post(f"{live_server}/v1/messages", json=body, headers=headers, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["message"].startswith("thinking.display")


def test_a_request_shaped_as_claude_code_sends_it_is_answered(start_worker, live_server, model):
    """What Claude Code 2.1.332 sends on every turn (read from the wire; its prompt cut short): adaptive thinking,
    a context edit that clears thinking blocks, an effort, a deferred tool, a system turn among the messages, a
    metadata user id of JSON text, the beta query and headers, streamed."""
    start_worker()
    body = {
        "model": model,
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332;"},
            {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>be brief</system-reminder>"},
                    {"type": "text", "text": "list the files here"},
                ],
            },
            {
                "role": "system",
                "content": [{"type": "text", "text": "The date is today.", "cache_control": {"type": "ephemeral"}}],
            },
        ],  # fmt: skip
        "tools": [
            {**WEATHER, "name": "Bash"},
            {
                "name": "DeferredToolPlaceholder",
                "description": "d",
                "input_schema": {"type": "object"},
                "defer_loading": True,
            },
        ],  # fmt: skip
        "metadata": {"user_id": json.dumps({"device_id": "0" * 64, "account_uuid": "", "session_id": "s"})},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "temperature": 0,
    }
    headers = {
        "x-api-key": "k",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27",
    }
    body["max_tokens"] = 16
    with httpx.stream("POST", f"{live_server}/v1/messages?beta=true", json=body, headers=headers, timeout=60) as reply:
        assert reply.status_code == 200, reply.read()
        kinds = [line.removeprefix("event: ") for line in reply.iter_lines() if line.startswith("event: ")]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    # a deferred tool is not told to the model: asked for by name, it is refused as one not given
    forced = {**body, "stream": False, "tool_choice": {"type": "tool", "name": "DeferredToolPlaceholder"}}
    refused = httpx.post(f"{live_server}/v1/messages", json=forced, headers=headers, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error"


def test_a_stop_sequence_hit_is_told_by_name(start_worker, live_server, model):
    start_worker()
    messages = sdk(live_server)
    ask = {"model": model, "max_tokens": 40, "messages": ASK, "extra_body": {"temperature": 0}}
    free = messages.messages.create(**ask).content[0].text
    words = free.split()
    stop = words[len(words) // 2]  # a word of the answer's middle: it stops at its first appearance
    cut = messages.messages.create(**ask, stop_sequences=["never said", stop])
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    assert cut.content[0].text == free[: free.index(stop)]
    with messages.messages.stream(**ask, stop_sequences=[stop]) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence, final.content[0].text) == (
        "stop_sequence",
        stop,
        cut.content[0].text,
    )
    # no stop sequence hit: end_turn or max_tokens, and none told
    assert messages.messages.create(**ask).stop_sequence is None
