"""Generated hostile schemas against the real `onelane web` (gunicorn + gevent): deep `$ref` graphs, wide objects,
long enums, hostile patterns, and mixes of them. Every answer is an admission or a 4xx, within a bounded time, and
the web's worker process is the one that started (a crash would have had gunicorn start another).
SCHEMA_FUZZ_EXAMPLES=N runs N examples instead of the bounded default."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from tasks.grammar_check import CHECK_S

EXAMPLES = int(os.environ.get("SCHEMA_FUZZ_EXAMPLES", "60"))
ANSWER_S = CHECK_S + 10  # a check's bound, and room for a starved 2-core machine

pytestmark = pytest.mark.timeout(900)


@st.composite
def ref_graphs(draw: st.DrawFn) -> dict[str, Any]:
    """Definitions that refer to each other at random (chains, cycles, diamonds), some very many."""
    n = draw(st.integers(1, 40) | st.sampled_from([300, 1500, 3000]))
    fan = draw(st.integers(1, 3))
    defs = {}
    for i in range(n):
        targets = draw(st.lists(st.integers(0, n), min_size=1, max_size=fan)) if n < 100 else [i + 1]
        refs = [{"$ref": f"#/$defs/d{t}"} for t in targets]
        defs[f"d{i}"] = {"anyOf": [*refs, {"type": draw(st.sampled_from(["integer", "string", "null"]))}]}
    defs[f"d{n}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


@st.composite
def wide_objects(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 50) | st.sampled_from([399, 400, 401, 600, 8000]))
    required = draw(st.sampled_from(["none", "all", "half"]))
    names = [f"p{i}" for i in range(n)]
    schema: dict[str, Any] = {"type": "object", "properties": {p: {"type": "string"} for p in names}}
    if required != "none":
        schema["required"] = names if required == "all" else names[::2]
    return schema


@st.composite
def long_enums(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 30) | st.sampled_from([999, 1000, 1001, 20000]))
    return {"enum": [f"value number {i}" for i in range(n)]}


PATTERNS = [
    "(a|b)*a(a|b){30}",  # a DFA of 2^30 states, if built eagerly
    "(a*)*b",
    "((a{1,100}){1,100}){1,100}",
    "[a-z]{0,65535}",
    ".{100000}",
    "(x+x+)+y",
    "\\p{L}{1,1000}",
    "(?:(?:(?:(?:a)*)*)*)*",
    "[",
    "(?P<n>a)(?P=n)",
]


@st.composite
def hostile_patterns(draw: st.DrawFn) -> dict[str, Any]:
    pattern = draw(st.sampled_from(PATTERNS) | st.text(alphabet="()[]{}*+?|.ab0-9,\\^$", max_size=40))
    return {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}, "required": ["s"]}


@st.composite
def deep_nesting(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(draw(st.integers(1, 40))):
        schema = draw(
            st.sampled_from(
                [
                    {"type": "array", "items": schema},
                    {"type": "object", "properties": {"a": schema}},
                    {"anyOf": [schema, {"type": "null"}]},
                ]
            )
        )
    return schema


schemas = st.one_of(ref_graphs(), wide_objects(), long_enums(), hostile_patterns(), deep_nesting()) | st.builds(
    lambda a, b: {"type": "object", "properties": {"a": a, "b": b}},
    st.one_of(wide_objects(), long_enums(), hostile_patterns()),
    st.one_of(ref_graphs(), deep_nesting()),
)


def web_workers(master: int) -> set[int]:
    """The pids of a gunicorn master's worker processes."""
    return {int(pid) for pid in Path(f"/proc/{master}/task/{master}/children").read_text().split()}


def test_generated_schemas_get_an_answer_in_time_and_the_web_survives(web_process, model):
    base_url, master = web_process(ONELANE_MAX_QUEUE="100000", ONELANE_MAX_QUEUED_PER_USER="100000")
    workers = web_workers(master.pid)
    statuses: list[int] = []

    @hypothesis_settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,  # (the same examples in every run: CI fails on what a run here would)
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(schema=schemas, door=st.sampled_from(["json_schema", "tool"]))
    def send(schema: dict[str, Any], door: str) -> None:
        if door == "json_schema":
            fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
            path, body = "/v1/jobs", {"messages": [{"role": "user", "content": "x"}], "response_format": fmt}
        else:  # (a background response is answered once queued, as a job is)
            tools = [{"type": "function", "name": "f", "parameters": schema}]
            path, body = "/v1/responses", {"model": model, "input": "x", "tools": tools, "background": True}
        began = time.monotonic()
        answer = requests.post(base_url + path, json=body, timeout=ANSWER_S + 30)
        took = time.monotonic() - began
        assert answer.status_code in (200, 202, 400, 413, 422), (answer.status_code, answer.text[:300])
        assert took < ANSWER_S, (took, str(schema)[:200])
        assert "Traceback" not in answer.text and answer.headers["content-type"].startswith("application/json")
        if answer.status_code == 202:
            requests.delete(f"{base_url}/v1/jobs/{answer.json()['id']}", timeout=30)
        elif answer.status_code == 200:
            requests.post(f"{base_url}/v1/responses/{answer.json()['id']}/cancel", timeout=30)
        statuses.append(answer.status_code)

    send()
    assert master.poll() is None and web_workers(master.pid) == workers, "a web worker process died"
    assert {200, 202, 400, 422} <= set(statuses), statuses  # (both kinds were met: the story tried each way)
    assert requests.get(f"{base_url}/healthz", timeout=10).status_code == 200
