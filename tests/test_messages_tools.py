"""Anthropic's tool round trip on the default model, as the official `anthropic` SDK sends it (issue 60, item 11):
a forced tool's input is JSON of its schema, or, cut by `max_tokens`, not handed back at all (the stop reason says
so); and each block of the answer goes back as the SDK dumps it (`model_dump()`, with its null `caller` and
`toolset_name`), with or without its nulls, or streamed, and the second turn is answered."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import jsonschema
import pytest
from anthropic.types import RedactedThinkingBlock, ThinkingBlock

pytestmark = [pytest.mark.default_model, pytest.mark.timeout(300)]

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city now",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
FORCED = {"type": "tool", "name": "get_weather"}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"extra_body": {"temperature": 0}}  # (the installed SDK takes no `temperature` of its own)


def sdk(live_server: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live_server, api_key="anything", max_retries=0)


def answered(messages: anthropic.Anthropic, model: str, history: list[dict[str, Any]]) -> anthropic.types.Message:
    """The second turn, the tool's result told: a message, its calls (if it makes any) of the tool's schema."""
    second = messages.messages.create(model=model, max_tokens=40, messages=history, tools=[WEATHER], **GREEDY)
    assert second.content and second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    for block in second.content:
        if block.type == "tool_use":
            jsonschema.validate(block.input, WEATHER["input_schema"])
    return second


def with_result(assistant: list[Any], tool_use_id: str) -> list[dict[str, Any]]:
    result = {"type": "tool_result", "tool_use_id": tool_use_id, "content": "18 C, clear"}
    return [*ASK, {"role": "assistant", "content": assistant}, {"role": "user", "content": [result]}]


def test_a_forced_tools_blocks_go_back_as_the_sdk_dumps_them_and_the_next_turn_is_answered(
    start_worker, live_server, model
):
    # Given the default model and a tool whose schema requires `city`
    start_worker()
    messages = sdk(live_server)
    ask = {"model": model, "max_tokens": 80, "messages": ASK, "tools": [WEATHER], "tool_choice": FORCED, **GREEDY}

    # When the tool is forced, whole and streamed
    called = messages.messages.create(**ask)
    with messages.messages.stream(**ask) as stream:
        streamed = stream.get_final_message()

    # Then each answer is one call of it, its input JSON of the schema
    for answer in (called, streamed):
        assert answer.stop_reason == "tool_use"
        (use,) = answer.content
        assert use.type == "tool_use" and use.name == "get_weather"
        jsonschema.validate(use.input, WEATHER["input_schema"])
    assert streamed.content[0].input == called.content[0].input

    # And its blocks go back as the SDK dumps them (with `caller` and `toolset_name` null), without the nulls, as the
    # SDK's own objects, and from the stream: each second turn is answered
    use, streamed_use = called.content[0], streamed.content[0]
    assert {"caller", "toolset_name"} <= use.model_dump().keys()
    sent_back = [
        ([b.model_dump() for b in called.content], use.id),
        ([b.model_dump(exclude_none=True) for b in called.content], use.id),
        (list(called.content), use.id),
        ([b.model_dump() for b in streamed.content], streamed_use.id),
    ]
    for assistant, tool_use_id in sent_back:
        answered(messages, model, with_result(assistant, tool_use_id))


def test_a_forced_call_cut_by_max_tokens_is_not_handed_back_and_the_stop_reason_says_so(
    start_worker, live_server, model
):
    # Given the forced tool and too few tokens to write its call to the end
    start_worker()
    messages = sdk(live_server)
    ask = {"model": model, "max_tokens": 20, "messages": ASK, "tools": [WEATHER], "tool_choice": FORCED, **GREEDY}

    # When it is asked, whole
    cut = messages.messages.create(**ask)

    # Then it ended at max_tokens, and no call with an unfinished input is handed back
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 20
    assert [b.type for b in cut.content] == ["text"] and cut.content[0].text == ""

    # And streamed, the call's pieces went out as they came (as Anthropic's do), the stop reason the same
    with messages.messages.stream(**ask) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "max_tokens" and [b.type for b in streamed.content] == ["tool_use"]


def test_forced_calls_sampled_at_once_are_of_the_schema_or_told_cut(start_worker, live_server, model):
    # Given the request as it was sent: sampled at Anthropic's default temperature (1), 80 tokens
    start_worker()
    messages = sdk(live_server)
    ask = {"model": model, "max_tokens": 80, "messages": ASK, "tools": [WEATHER], "tool_choice": FORCED}

    # When eight are sent at once (one batch)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: messages.messages.create(**ask), range(8)))

    # Then each is a call of the schema, or ended at max_tokens with no call handed back
    for answer in answers:
        uses = [b for b in answer.content if b.type == "tool_use"]
        if answer.stop_reason == "max_tokens":
            assert uses == []
        else:
            assert answer.stop_reason == "tool_use" and len(uses) == 1
            jsonschema.validate(uses[0].input, WEATHER["input_schema"])


def test_thinking_blocks_sent_back_are_read_as_anthropics_models_read_them_not_at_all(start_worker, live_server, model):
    # Given an earlier answer with thinking (another model's), as the SDK's own blocks dump it
    start_worker()
    messages = sdk(live_server)
    thought = [
        ThinkingBlock(type="thinking", thinking="Paris is in France.", signature="c2ln").model_dump(),
        RedactedThinkingBlock(type="redacted_thinking", data="ZW5j").model_dump(),
        {"type": "text", "text": "It is sunny."},
    ]
    plain = [{"type": "text", "text": "It is sunny."}]

    # When both conversations are counted
    def counted(assistant: list[dict[str, Any]]) -> int:
        history = [*ASK, {"role": "assistant", "content": assistant}, {"role": "user", "content": "And in Rome?"}]
        return messages.messages.count_tokens(model=model, messages=history).input_tokens

    # Then the thinking is not read: the prompts are the same
    assert counted(thought) == counted(plain)


def test_what_onelane_cannot_honor_in_a_block_is_a_400_naming_it(live_server, model):
    # Given calls sent back from toolsets or server tools, which onelane does not serve
    messages = sdk(live_server)
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    refused = {
        "toolset": {**use, "toolset_name": "browser"},
        "server tool": {**use, "caller": {"type": "code_execution_20250825", "tool_id": "srvtoolu_1"}},
    }
    for what, block in refused.items():
        # When one is sent back
        with pytest.raises(anthropic.BadRequestError) as bad:
            messages.messages.create(
                model=model, max_tokens=8, tools=[WEATHER], messages=with_result([block], "toolu_1")
            )
        # Then it is Anthropic's 400, naming the message and what it holds
        error = bad.value.body["error"]
        assert error["type"] == "invalid_request_error" and "messages.1.content" in error["message"]
        assert what in error["message"]
