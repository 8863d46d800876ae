"""OpenAI's Responses API on the queue: /v1/responses, in background mode or not, streamed or not.

A response is a job (its id is the job's, `resp_` for `job_`), readable and cancellable as the job is; what only a
response has (background, instructions, metadata, the `text` and `tools` it echoes) is kept with the job's spec.
`text.format` and function `tools` are the job's grammar, as chat completions' (tasks/structured.py): an answer
that made calls has a `function_call` output item per call. Its status is the job's:

    job            queued   in_progress   completed (stop)   completed (length)   failed   expired   cancelled
    response       queued   in_progress   completed          incomplete           failed   failed    cancelled

Its stream events are numbered (`sequence_number`) from the job's durable log, so the same job always gives the same
numbering: `GET /v1/responses/{id}?stream=true&starting_after=N` resumes exactly after event N, as `Last-Event-ID`
does on the job's own stream. A background response runs whoever follows it; a foreground one is watched by its
request, as the chat endpoint's: a client that hangs up has it cancelled.
"""

from __future__ import annotations

import contextlib
import reprlib
from collections.abc import Iterator

from flask import Blueprint, Response, jsonify, request

from tasks.errors import (
    Forbidden,
    InvalidParameter,
    InvalidRequest,
    JobAlreadyEnded,
    JobNotFound,
    NotFound,
    PreviousResponseNotFound,
    Unauthorized,
    Unavailable,
)
from tasks.events import Event
from tasks.job import Job, JobStatus, Message, new_job_id
from web import sse
from web.admission import admit
from web.apidoc import JSON, SSE, Reply, documented, reply
from web.auth import current_owner
from web.errors import job_error
from web.feed import Feed
from web.follow import CLIENT_GONE, Gone, Story, cancel_quietly, follow
from web.limits import CANCEL_WAIT_S, LIMIT, ORDER, after, list_limit, oldest_first
from web.openai.body import list_page
from web.openai.responses.answers import InputItemList, OpenAIResponse, ResponseStreamEvent
from web.openai.responses.body import PREFIX, items_of, snapshot, status_of
from web.openai.responses.input import conversation_of, input_of
from web.openai.responses.schemas import RESPONSE_NEUTRAL, ResponseRequest
from web.openai.responses.stream import ResponseStream
from web.requests import REQUEST_ERRORS, parse_strict
from web.schemas import json_body
from web.services import services

bp = Blueprint("responses", __name__)

STREAM_NOTE = (
    "With `stream=true`: `text/event-stream`, each event named by its `type`, numbered by `sequence_number` from 0 "
    "(the same numbers on every stream of one response), `: queued, position N` comments while it waits; no `[DONE]`."
)
STREAM_EVENT = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string"},
        "data": {"type": "string", "contentMediaType": JSON, "contentSchema": ResponseStreamEvent},
    },
}
ANSWER = Reply(
    "the response, or (`stream`) its events",
    {JSON: OpenAIResponse, SSE: STREAM_EVENT},
    {"x-onelane-job-id": False},
)


class ResponseNotFound(NotFound):
    """No such response, or not one of the caller's."""


def _own(rid: str) -> Job:
    """The caller's response `rid` (another user's, or a job made otherwise, is not found)."""
    with contextlib.suppress(JobNotFound):
        if rid.startswith(PREFIX):
            job = services().store.get("job_" + rid.removeprefix(PREFIX), current_owner())
            if job.spec.response is not None:
                return job
    raise ResponseNotFound(f"no response {reprlib.repr(rid)}")  # (a bounded excerpt of what was sent)


@bp.post("/v1/responses")
@documented(
    "createResponse",
    "Create a response (Responses API)",
    "openai",
    description="A job in the same queue. `background: true`: answered at once with the response, `queued`; it runs "
    "whoever follows it. Otherwise the request waits for it (and a client that hangs up has it cancelled). "
    "`previous_response_id` continues a response that ended completed or incomplete: its input and answer come "
    'before this `input`. `include` `["message.output_text.logprobs"]` (and `top_logprobs`): the output text\'s log '
    "probabilities, each text delta's with it. " + STREAM_NOTE,
    body=ResponseRequest,
    answers={200: ANSWER},
    errors=[*REQUEST_ERRORS, PreviousResponseNotFound],
)
def create() -> Response:
    owner = current_owner()
    req: ResponseRequest = parse_strict(ResponseRequest, json_body(request), RESPONSE_NEUTRAL)
    before = _continued(req.previous_response_id) if req.previous_response_id is not None else ()
    spec, ttl_s = req.admission(owner, services().settings, before=before)
    if req.background and not req.stream:
        return jsonify(snapshot(admit(spec, ttl_s)))
    svc = services()
    job_id = new_job_id()
    feed = Feed(svc.store, svc.hub, job_id, replay=False)  # subscribed before the job exists: nothing is missed
    try:
        job = admit(spec, ttl_s, job_id=job_id)
    except BaseException:
        feed.close()
        raise
    environ = None if req.background else request.environ  # a background response runs whoever follows it
    story = follow(svc.store, svc.hub, job, ping_s=svc.settings.sse_ping_s, environ=environ, feed=feed)
    if req.stream:
        stream = ResponseStream(job, watcher=not req.background).events(story)
        return sse.response(stream, {"x-onelane-job-id": job.id}, on_close=feed.close)
    return _answer(job, story)


def _continued(rid: str) -> tuple[Message, ...]:
    """The conversation the caller's response `rid` ended with, for a response that continues it."""
    try:
        job = _own(rid)
    except ResponseNotFound:
        raise PreviousResponseNotFound(
            f"Previous response with id {reprlib.repr(rid)} not found (a response is kept ONELANE_RESULT_TTL after "
            "its end).",
            param="previous_response_id",
        ) from None
    if job.status is not JobStatus.COMPLETED:
        raise InvalidRequest(
            f"response {reprlib.repr(rid)} is {status_of(job)}: only a completed or incomplete response can be "
            "continued",
            param="previous_response_id",
        )
    return conversation_of(job)


@bp.get("/v1/responses/<rid>")
@documented(
    "getResponse",
    "Get a response",
    "openai",
    description="The response now; with `stream=true`, its events from the start, or after `starting_after`. "
    + STREAM_NOTE,
    params=[
        {"name": "stream", "in": "query", "schema": {"type": "string", "enum": ["true", "false"]}},
        {
            "name": "starting_after",
            "in": "query",
            "schema": {"type": "integer", "minimum": 0},
            "description": "the sequence_number of the last event the client has",
        },
    ],
    answers={200: ANSWER},
    errors=[(InvalidParameter, "`stream` or `starting_after`"), Unauthorized, ResponseNotFound, Unavailable],
)
def retrieve(rid: str) -> Response:
    job = _own(rid)
    if not _flag(request.args.get("stream", "false")):
        services().store.keep_watching(job)
        return jsonify(snapshot(job))
    after = _starting_after()
    svc = services()
    svc.store.follow_live(job)  # its tokens, as they come
    story = follow(svc.store, svc.hub, job, ping_s=svc.settings.sse_ping_s)  # (it watches, but cancels nothing)
    return sse.response(ResponseStream(job, after).events(story), {"x-onelane-job-id": job.id})


@bp.get("/v1/responses/<rid>/input_items")
@documented(
    "listResponseInputItems",
    "List a response's input items",
    "openai",
    description="The conversation the response answered: its input and, for one that continues another "
    "(`previous_response_id`), every earlier input and answer; its `instructions` apart.",
    params=[LIMIT, ORDER, after("list those after this item, in the order asked")],
    answers={200: reply("the items", InputItemList)},
    errors=[(InvalidParameter, "`limit`, `order` or `after`"), Unauthorized, ResponseNotFound, Unavailable],
)
def input_items(rid: str) -> Response:
    """The conversation a response answered (its instructions apart), newest first unless `order=asc`: messages,
    the calls an assistant made, and their outputs."""
    job = _own(rid)
    items = [item for n, turn in enumerate(input_of(job)) for item in items_of(job, n, turn)]
    if not oldest_first():
        items.reverse()
    start = 0
    after = request.args.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise InvalidParameter("after must be the id of one of this response's input items", param="after")
        start = ids.index(after) + 1
    limit = list_limit()
    return jsonify(list_page(items[start : start + limit], start + limit < len(items)))


@bp.post("/v1/responses/<rid>/cancel")
@documented(
    "cancelResponse",
    "Cancel a background response",
    "openai",
    description="Queued: it never runs; running: it stops within a step, keeping its partial output. Again, or once "
    "it ended: the response as it is.",
    answers={200: reply("the response", OpenAIResponse)},
    errors=[
        (InvalidRequest, "a foreground response: it ends with its own request"),
        Unauthorized,
        Forbidden,
        ResponseNotFound,
        Unavailable,
    ],
)
def cancel(rid: str) -> Response:
    """Cancel a response: queued, it never runs; running, it stops within a step. Again, or once it ended: the
    response as it is."""
    job = _own(rid)
    if not job.spec.response.background:  # type: ignore[union-attr]  # (_own finds only jobs with a response)
        raise InvalidRequest("only a background response can be cancelled (a foreground one ends with its request)")
    try:
        job = services().store.cancel(job.id, job.owner, wait_s=CANCEL_WAIT_S)
    except JobAlreadyEnded:
        job = services().store.get(job.id, job.owner)
    return jsonify(snapshot(job))


def _flag(raw: str) -> bool:
    if raw.lower() not in ("true", "false", "1", "0"):
        raise InvalidParameter("stream must be true or false", param="stream")
    return raw.lower() in ("true", "1")


def _starting_after() -> int:
    raw = request.args.get("starting_after", "")
    if not raw:
        return -1
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 10):
        raise InvalidParameter("starting_after must be the sequence_number of an event", param="starting_after")
    return int(raw)


def _answer(job: Job, story: Iterator[Story]) -> Response:
    """A foreground response, whole, once its job ended (nothing read back before the end)."""
    for item in story:
        if isinstance(item, Gone):
            cancel_quietly(services().store, job, CLIENT_GONE)
            return Response(status=499)
        if isinstance(item, Event) and item.terminal:
            ended = services().store.get(job.id)
            if ended.status is not JobStatus.COMPLETED:
                raise job_error(ended, services().settings.model_retry_s)
            return jsonify(snapshot(ended))
    raise job_error(services().store.get(job.id), services().settings.model_retry_s)
