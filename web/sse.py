"""Server-sent events: the lines of a stream, and the response that carries one (shared by onelane's job stream
and the OpenAI streams)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from flask import Response, stream_with_context


def event(name: str, data: dict[str, Any], event_id: int | None = None) -> str:
    """A named event with JSON data, and its id when it has one (what `Last-Event-ID` sends back)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\n{data_line(data)}"


def data_line(data: dict[str, Any]) -> str:
    """An unnamed event: JSON data alone (OpenAI's chunks)."""
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


def comment(text: str) -> str:
    """A comment line: clients ignore it; it keeps the connection alive and shows what happens."""
    return f": {text}\n\n"


def response(
    stream: Iterator[str], headers: dict[str, str] | None = None, on_close: Callable[[], None] | None = None
) -> Response:
    """A streamed `text/event-stream` answer that no proxy buffers or caches; `on_close` runs when it ends, also
    when the client left before it started."""
    answer = Response(
        stream_with_context(stream),
        mimetype="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
    )
    if on_close is not None:
        answer.call_on_close(on_close)
    return answer
