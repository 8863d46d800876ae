"""A Batch API input file, read line by line into the jobs it asks for, and the lines it cannot be.

Each line of the JSONL file is `{"custom_id", "method": "POST", "url", "body"}`; its body is checked exactly as the
endpoint `url` checks a request (the same request models and server limits: web/openai/chat/schemas.py,
responses/schemas.py), and becomes a job of the batch class that nobody watches. A line that cannot be one (not JSON,
no custom_id, a custom_id seen before, another method, a url that is not the batch's endpoint, a body the endpoint
refuses, `stream`) is an error line with its custom_id, never the whole batch's failure; only a file in which no line
is a JSON object is refused whole (NotJsonl), and one of more lines than a batch takes (TooManyLines) before any line
is read.

The file is split a piece at a time, never decoded or split whole: a 32 MiB file of tiny lines would take 80 times its
size split, and more parsed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from tasks.errors import InvalidJSON, InvalidRequest, OnelaneError
from tasks.job import JobSpec
from tasks.settings import Settings
from web.openai.chat.schemas import ChatRequest, CompletionRequest
from web.openai.pooling.routes import EmbeddingRequest
from web.openai.responses.schemas import RESPONSE_NEUTRAL, ResponseRequest
from web.openai.schemas import NEUTRAL
from web.requests import parse_strict
from web.schemas import loads_checked

#: For each endpoint a batch may address (tasks/endpoints.py), the request model its lines' bodies are, and its
#: neutral fields.
REQUESTS: dict[str, tuple[type[BaseModel], dict[str, tuple[Any, ...]]]] = {
    "/v1/chat/completions": (ChatRequest, NEUTRAL),
    "/v1/completions": (CompletionRequest, NEUTRAL),
    "/v1/responses": (ResponseRequest, RESPONSE_NEUTRAL),
    "/v1/embeddings": (EmbeddingRequest, {}),
}


YIELD_EVERY = 500  # lines read between two yields (50,000 lines take ~2 s to check on one core)
PIECE = 256 * 1024  # bytes of the file split at a time (a line longer than that is one piece)


class NotJsonl(OnelaneError):
    """No line of the file is a JSON object: it is no batch input at all."""

    type = "invalid_file"


class TooManyLines(InvalidRequest):
    """The file holds more lines than ONELANE_MAX_BATCH_LINES: no batch is made of it."""


@dataclass(frozen=True)
class Line:
    """A line that is a job: its place in the file (from 0), its custom_id, and the job (as JSON: a tenth of the
    JobSpec's size, for 50,000 of them) with its TTL."""

    index: int
    custom_id: str
    spec_json: str
    ttl_s: float

    @property
    def spec(self) -> JobSpec:
        return JobSpec.model_validate_json(self.spec_json)


@dataclass(frozen=True)
class LineError:
    """A line that is not a job, and why (`code` as OpenAI's batch errors name them, `message` in words)."""

    index: int
    custom_id: str | None
    code: str
    message: str


def read_lines(data: bytes, endpoint: str, owner: str, settings: Settings) -> tuple[list[Line], list[LineError]]:
    """Every non-blank line of `data` as a Line or a LineError, in file order (NotJsonl: none is a JSON object;
    TooManyLines: more than ONELANE_MAX_BATCH_LINES, found before any is parsed)."""
    _count(data, settings.max_batch_lines)
    lines: list[Line] = []
    errors: list[LineError] = []
    seen: set[str] = set()
    objects = 0
    for index, raw in enumerate(_texts(data)):
        if index % YIELD_EVERY == YIELD_EVERY - 1:
            time.sleep(0)  # under gevent (onelane web), let the process's other requests and streams run meanwhile
        if not raw.strip():
            continue
        try:
            item = loads_checked(raw, what="the line")
        except InvalidJSON as exc:
            errors.append(LineError(index, None, "invalid_json", exc.message))
            continue
        if not isinstance(item, dict):
            errors.append(LineError(index, None, "invalid_json", "the line is not a JSON object"))
            continue
        objects += 1
        outcome = _line(index, item, endpoint, owner, settings, seen)
        (lines if isinstance(outcome, Line) else errors).append(outcome)  # type: ignore[arg-type]  # (each to its list: mypy does not narrow through the choice)
    if not objects:
        raise NotJsonl("no line of the file is a JSON object: a batch's input is JSONL, one request a line")
    return lines, errors


def _count(data: bytes, limit: int) -> None:
    """Refuse a file of more than `limit` non-blank lines as soon as the next one is met (TooManyLines)."""
    count = 0
    for index, raw in enumerate(_texts(data)):
        if index % YIELD_EVERY == YIELD_EVERY - 1:
            time.sleep(0)  # (a file may hold millions of blank lines)
        if raw.strip():
            count += 1
            if count > limit:
                raise TooManyLines(
                    f"the file holds more than {limit} requests; a batch takes at most {limit} "
                    "(ONELANE_MAX_BATCH_LINES)",
                    param="input_file_id",
                )


def _texts(data: bytes) -> Iterator[str]:
    """The lines of UTF-8 `data` (decoded with errors="replace"), each ended by a \n or a \r\n, as JSONL has them,
    decoded and split a piece of PIECE bytes (to the end of its last line) at a time. A piece ends just after a
    b"\n": no character is cut in two. Nothing else ends a line: U+2028, U+2029 and U+0085, which str.splitlines()
    breaks at, may stand unescaped in a JSON string."""
    view, start = memoryview(data), 0
    while start < len(data):
        end = data.find(b"\n", start + PIECE)
        end = len(data) if end < 0 else end + 1
        texts = str(view[start:end], "utf-8", "replace").split("\n")
        if data[end - 1 : end] == b"\n":
            texts.pop()  # (the nothing after the piece's last \n)
        yield from (text.removesuffix("\r") for text in texts)
        start = end


def _line(
    index: int, item: dict[str, Any], endpoint: str, owner: str, settings: Settings, seen: set[str]
) -> Line | LineError:
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
        return LineError(
            index, None, "missing_custom_id", "each line needs a custom_id: a string of 1 to 512 characters"
        )
    if custom_id in seen:
        return LineError(index, custom_id, "duplicate_custom_id", "this custom_id is on an earlier line")
    seen.add(custom_id)
    if item.get("method") != "POST":
        return LineError(index, custom_id, "invalid_method", "method must be POST")
    url = item.get("url")
    if url != endpoint:
        known = url in REQUESTS
        why = f"this batch's endpoint is {endpoint}" if known else f"unknown url; one of {', '.join(REQUESTS)}"
        return LineError(index, custom_id, "invalid_url", why)
    body = item.get("body")
    if not isinstance(body, dict):
        return LineError(index, custom_id, "invalid_body", "body must be a JSON object: the request to the endpoint")
    if body.get("stream"):
        return LineError(index, custom_id, "invalid_body", "a batch's requests are not streamed: leave out stream")
    model, neutral = REQUESTS[endpoint]
    try:
        req = parse_strict(model, dict(body), neutral)
        spec, ttl_s = req.admission(owner, settings, batch=True)
    except OnelaneError as exc:
        where = f" ({exc.param})" if exc.param else ""
        return LineError(index, custom_id, exc.type, exc.message + where)
    return Line(index, custom_id, spec.model_dump_json(), ttl_s)
