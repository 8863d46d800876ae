"""What an answer must be, and the grammar that makes it so: JSON of a schema, any JSON object, or tool calls.

The web builds the grammar at admission from what the request asks (`response_format`, `text.format`, `tools` and
`tool_choice`) and checks it there, so a schema llguidance cannot compile, one using a feature it does not support,
or one past the bounds of tasks/schema_limits.py, is a 400 naming it before anything is queued. llguidance runs in
checker processes (tasks/grammar_check.py), never in the web's own. The job carries the grammar; its worker compiles it against
the model's tokenizer and masks every token that would break it (worker/grammar.py).

Tool calls have one format on every model, the one Hermes and Qwen templates use, enforced by the grammar:

    <tool_call>
    {"name": "get_weather", "arguments": {"city":"Paris"}}
    </tool_call>

several calls one after another, a newline between them. The web reads calls back out of the answer (`CallReader`),
whole or as a stream goes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from tasks.errors import InvalidRequest
from tasks.grammar_check import checked

# (re-exported, `as` themselves: the web imports them from here)
from tasks.job import Constraint as Constraint
from tasks.job import Tool as Tool
from tasks.job import ToolCall as ToolCall
from tasks.schema_limits import LIMITS, check_schema

CALL_OPEN = '<tool_call>\n{"name": "'
CALL_ARGS = '", "arguments": '
CALL_CLOSE = "}\n</tool_call>"
CALL_SEP = "\n"
#: how JSON is written under a grammar: compact, one way (a small model given free whitespace may write nothing else)
JSON_OPTIONS = {"whitespace_flexible": False}
ANY_OBJECT: dict[str, Any] = {"type": "object"}


ToolChoice = Literal["auto", "required"] | str  # or a function's name


def json_constraint(schema: dict[str, Any] | None, param: str) -> Constraint:
    """JSON of `schema` (None: any JSON object, as `json_object` asks); a 400 naming `param` if it cannot be."""
    if schema is not None and not isinstance(schema, dict):
        raise InvalidRequest("a JSON schema must be an object", param=param)
    return Constraint(kind="json", grammar=_from_schema(schema or ANY_OBJECT, param))


def tools_constraint(tools: tuple[Tool, ...], choice: ToolChoice, parallel: bool) -> Constraint:
    """Calls of `tools` (`required`: one or more; a function's name: that one; `auto`: text or calls), each call's
    arguments valid for its function's parameters."""
    if choice not in ("auto", "required"):
        tools = tuple(t for t in tools if t.name == choice)
        if not tools:
            raise InvalidRequest(f"tool_choice names a function that is not in tools: {choice!r}", param="tool_choice")
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise InvalidRequest("two tools have the same name", param="tools")
    rules = []
    size = 0
    for i, tool in enumerate(tools):
        _from_schema(tool.parameters, f"tools[{i}].parameters")  # each checked alone, to name the one at fault
        size += len(json.dumps(tool.parameters))
        if size > LIMITS.tools_bytes:
            raise InvalidRequest(f"the tools' schemas are over {LIMITS.tools_bytes:,} bytes in all", param="tools")
        schema = json.dumps({**_annotated(tool.parameters), "x-guidance": JSON_OPTIONS})
        rules.append(f"call_{i}: {_lark_string(CALL_OPEN + tool.name + CALL_ARGS)} args_{i} {_lark_string(CALL_CLOSE)}")
        rules.append(f"args_{i}: %json {schema}")
    calls = "call (" + _lark_string(CALL_SEP) + " call)*" if parallel else "call"
    start = "start: TEXT | calls" if choice == "auto" else "start: calls"
    lark = "\n".join(
        [
            start,
            f"calls: {calls}",
            "call: " + " | ".join(f"call_{i}" for i in range(len(tools))),
            *rules,
            r"TEXT: /[^<](.|\n)*/",  # an answer in words: anything that does not open a call
        ]
    )
    return Constraint(kind="tools", grammar=checked("lark", lark, "tools"))


#: the `format`s llguidance enforces; any other is an annotation only (as JSON Schema 2020-12 has it by default)
FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri"})
COUNTS = frozenset({"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"})
#: keywords whose value maps names to schemas (a property called "format" is not the keyword)
SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def _annotated(schema: Any) -> Any:
    """The schema as llguidance reads it, meaning the same: a `format` it does not know is dropped (an annotation,
    which a validator does not assert by default), and a count written as a whole float (`2.0`) is an integer."""
    if isinstance(schema, list):
        return [_annotated(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "format" and isinstance(value, str) and value not in FORMATS:
            continue
        if key in COUNTS and isinstance(value, float) and value.is_integer():
            value = int(value)
        elif key in SCHEMA_MAPS and isinstance(value, dict):
            value = {name: _annotated(s) for name, s in value.items()}
        elif key not in ("const", "enum", "default", "examples"):  # (values, not schemas)
            value = _annotated(value)
        out[key] = value
    return out


def _from_schema(schema: dict[str, Any], param: str) -> str:
    """The grammar of `schema`, within the bounds and checked; else a 400 naming `param`."""
    check_schema(schema, param)
    return checked("schema", json.dumps(_annotated(schema)), param, overrides=JSON_OPTIONS)


def _lark_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a Lark string literal


def render_call(call: ToolCall) -> str:
    """A call as the model writes it (a conversation's earlier call, rendered for a model without tool support)."""
    return f"{CALL_OPEN}{call.name}{CALL_ARGS}{call.arguments}{CALL_CLOSE}"


# --- reading calls out of an answer ------------------------------------------------------------------------------


@dataclass
class Piece:
    """What a piece of an answer adds: text, or a call begun (its `name`), or more of a call's `arguments`."""

    index: int = 0  # the call's, among the answer's calls
    text: str = ""
    name: str | None = None
    arguments: str = ""


@dataclass
class CallReader:
    """Reads an answer that may hold tool calls, as it is written: words go out as text, calls as their name and
    then their arguments, piece by piece. The grammar guarantees the layout; what does not follow it is text."""

    _seen: str = ""  # everything fed so far
    _at: int = 0  # how much of it is told
    _calls: int = 0
    _in_call: bool = False
    _text: bool | None = None  # the answer is words (True), calls (False), or not known yet (None)
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments) of each call begun
    closed: int = 0  # how many of them were written to their end (a call cut by max_tokens or a stop string is not)

    def feed(self, text: str, final: bool = False) -> list[Piece]:
        self._seen += text
        return list(self._read(final))

    def _read(self, final: bool) -> Iterator[Piece]:
        if self._text is None:
            head = self._seen[: len(CALL_OPEN)]
            if CALL_OPEN.startswith(head) and not final and len(head) < len(CALL_OPEN):
                return  # it may still open a call
            self._text = not self._seen.startswith(CALL_OPEN)
        if self._text:
            if self._at < len(self._seen):
                yield Piece(text=self._seen[self._at :])
                self._at = len(self._seen)
            return
        while True:
            if not self._in_call:
                rest = self._seen[self._at :]
                if rest.startswith(CALL_SEP):
                    rest, self._at = rest[len(CALL_SEP) :], self._at + len(CALL_SEP)
                name_end = rest.find(CALL_ARGS)
                if not rest.startswith(CALL_OPEN) or name_end < 0:
                    return
                name = rest[len(CALL_OPEN) : name_end]
                self._at += name_end + len(CALL_ARGS)
                self._in_call = True
                self.calls.append((name, ""))
                yield Piece(index=len(self.calls) - 1, name=name)
            rest = self._seen[self._at :]
            end = rest.find(CALL_CLOSE)
            told = rest[:end] if end >= 0 else rest if final else rest[: max(0, len(rest) - len(CALL_CLOSE))]
            if told:
                name, arguments = self.calls[-1]
                self.calls[-1] = (name, arguments + told)
                self._at += len(told)
                yield Piece(index=len(self.calls) - 1, arguments=told)
            if end < 0:
                return
            self._at += len(CALL_CLOSE)
            self._in_call = False
            self.closed += 1


def read_calls(text: str, constraint: Constraint | None, finished: bool = False) -> tuple[str, list[tuple[str, str]]]:
    """A whole answer's text and calls (name, arguments) under `constraint` (no calls unless it is `tools`);
    `finished`: only the calls written to their end, whose arguments the grammar made JSON of their schema (not one
    cut short by max_tokens or a stop string)."""
    if constraint is None or constraint.kind != "tools":
        return text, []
    reader = CallReader()
    words = "".join(d.text for d in reader.feed(text, final=True))
    return words, reader.calls[: reader.closed] if finished else reader.calls


def call_id(job_id: str, index: int) -> str:
    """A call's id: the same whenever the job is read, streamed or not."""
    return f"call_{job_id.removeprefix('job_')[:16]}_{index}"
