"""A job's conversation as its model's chat template reads it, tools included.

A template that knows tools (it names `tools`, as Qwen's, Hermes', Llama 3.1's do) gets them, and the conversation's
tool calls and results, in the Hugging Face form. A template that does not (SmolLM2's, the demo model's) gets them
in words: a system message that lists the tools and the call format (tasks/structured.py), the earlier calls
written in that format, and each tool's result as a user message between <tool_response> tags.

A message's `name` (OpenAI's: which participant of its role speaks) goes to a template that renders it (found by
rendering a name once per template) as the message's `name`; any other template reads it at the head of the
message's text, "name: text".
"""

from __future__ import annotations

import json
from typing import Any

from tasks.job import Message
from tasks.structured import CALL_ARGS, CALL_CLOSE, CALL_OPEN, Tool, render_call

FALLBACK_PROMPT = (
    "You may call the functions below. To call one, answer with exactly:\n"
    f"{CALL_OPEN}<function name>{CALL_ARGS}<arguments as a JSON object>{CALL_CLOSE}\n"
    "Functions:\n"
)


NAME_PROBE = "onelane_name_probe"  # a name no template writes of itself
_renders_names: dict[str, bool] = {}  # by template


def knows_tools(chat_template: Any) -> bool:
    return isinstance(chat_template, str) and "tools" in chat_template


def renders_names(tokenizer: Any) -> bool:
    """The tokenizer's chat template writes a message's `name` (most do not: SmolLM2's, Qwen's, Llama's)."""
    template = tokenizer.chat_template
    if not isinstance(template, str):
        return False
    if template not in _renders_names:
        probe = [{"role": "user", "content": "hi", "name": NAME_PROBE}]
        try:
            _renders_names[template] = NAME_PROBE in str(tokenizer.apply_chat_template(probe, tokenize=False))
        except Exception:  # a template that refuses this conversation (no system message, say): in words then
            _renders_names[template] = False
    return _renders_names[template]


def chat_input(
    messages: tuple[Message, ...], tools: tuple[Tool, ...], tokenizer: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages for `tokenizer`'s chat template, and its `tools` argument (None: none, or told in words)."""
    if not renders_names(tokenizer):
        messages = tuple(_named(m) for m in messages)
    if knows_tools(tokenizer.chat_template):
        return [_native(m) for m in messages], [_function(t) for t in tools] or None
    turns = [_in_words(m) for m in messages]
    if tools:
        told = FALLBACK_PROMPT + "\n".join(json.dumps(_function(t)["function"]) for t in tools)
        if turns and turns[0]["role"] == "system":
            turns[0] = {"role": "system", "content": turns[0]["content"] + "\n\n" + told}
        else:
            turns.insert(0, {"role": "system", "content": told})
    return turns, None


def _function(tool: Tool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


def _named(m: Message) -> Message:
    """A message with the name of its speaker at the head of its text."""
    if m.name is None:
        return m
    return m.model_copy(update={"content": f"{m.name}: {m.content}", "name": None})


def _native(m: Message) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.name is not None:
        turn["name"] = m.name
    if m.tool_calls:
        turn["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        turn["tool_call_id"] = m.tool_call_id
    return turn


def _arguments(text: str) -> Any:
    """Templates write arguments with `tojson`: they want the object, not its text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _in_words(m: Message) -> dict[str, str]:
    named = {"name": m.name} if m.name is not None else {}
    if m.role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{m.content}\n</tool_response>", **named}
    if m.tool_calls:
        calls = "\n".join(render_call(c) for c in m.tool_calls)
        return {"role": m.role, "content": f"{m.content}\n{calls}" if m.content else calls, **named}
    return {"role": m.role, "content": m.content, **named}
