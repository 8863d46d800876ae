"""Anthropic's Messages API on the queue: `POST /v1/messages` (whole or streamed) and `/v1/messages/count_tokens`.

Each request is a job in the same queue as every other (bounds, quotas, fairness, TTL), watched by its connection: a
client that hangs up has its job cancelled. Errors come in Anthropic's shape (`{"type": "error", "error": {"type",
"message"}}`), an overloaded queue as `529 overloaded_error` or `429 rate_limit_error` with `retry-after`, which the
`anthropic` SDKs honor when they retry.
"""

from __future__ import annotations

from contextlib import closing
from typing import Any

from flask import Blueprint, Response, jsonify, request

from tasks.events import Event, EventType
from tasks.job import Job, JobSpec, new_job_id
from web import sse
from web.admission import admit_followed, cancel_all, run_one
from web.anthropic import answers
from web.anthropic.body import MessageBody
from web.anthropic.schemas import CountRequest, MessagesRequest
from web.apidoc import JSON, SSE, Reply, documented, reply
from web.auth import current_owner
from web.errors import anthropic_error, job_error, shown_message, shown_status, status_for
from web.follow import CLIENT_GONE, Gone, Ping, Queued, follow
from web.requests import REQUEST_ERRORS, parse_strict
from web.schemas import json_body
from web.services import services

bp = Blueprint("anthropic", __name__)

#: A streamed answer's events, as /openapi.json describes them: each an `event:` line and its JSON `data:`.
STREAM = {
    "type": "object",
    "properties": {
        "event": {"type": "string"},
        "data": {"type": "string", "contentMediaType": JSON, "contentSchema": answers.StreamEvent},
    },
    "required": ["event", "data"],
}

#: Fields let through only with their neutral value (anything else would change the answer's meaning): none yet.
NEUTRAL: dict[str, tuple[Any, ...]] = {}


@bp.post("/v1/messages")
@documented(
    "createMessage",
    "Create a message (Anthropic's Messages API)",
    "anthropic",
    description="A job in the same queue, watched by the connection. `system`, `messages` (text, image, tool_use and "
    "tool_result blocks), `tools` and `tool_choice` (auto, any, tool, none: tool inputs are JSON of their "
    "input_schema, enforced as generated), `stop_sequences`, `temperature`, `top_p`, `top_k`, `metadata`; "
    '`cache_control` as the prefix cache keeps every answer (per owner). With `"stream": true`, Anthropic\'s events: '
    "message_start, content_block_start / _delta (text_delta, input_json_delta) / _stop, message_delta (stop reason, "
    "usage), message_stop; `ping` while the job waits. `thinking` (but disabled) and any other field onelane does "
    "not honor are a 400 naming it. Authenticated by `x-api-key` or `Authorization: Bearer`.",
    body=MessagesRequest,
    answers={
        200: Reply(
            "the whole message (`stream` false), or its events",
            {JSON: answers.Message, SSE: STREAM},
            {"x-onelane-job-id": True},
        )
    },
    errors=REQUEST_ERRORS,
)
def create_message() -> Response:
    owner = current_owner()
    req: MessagesRequest = parse_strict(MessagesRequest, json_body(request), NEUTRAL)
    admission = req.admission(owner, services().settings)
    cached, kept = req.marks_cache(), services().settings.prefix_cache_bytes > 0
    if req.stream:
        return _stream(admission, cached, kept)
    job = run_one(admission, "messages")
    response = jsonify(MessageBody(job, cached, kept).whole(job))
    response.headers["x-onelane-job-id"] = job.id
    return response


@bp.post("/v1/messages/count_tokens")
@documented(
    "countMessageTokens",
    "Count a message request's tokens",
    "anthropic",
    description="The prompt the request would send, in the model's tokens: its chat template, system, messages and "
    "tools rendered as a message request's are (by the worker, which holds the tokenizer: a short job of the queue "
    "that takes no place in the batch).",
    body=CountRequest,
    answers={200: reply("the count", answers.TokenCount)},
    errors=REQUEST_ERRORS,
)
def count_tokens() -> Response:
    owner = current_owner()
    req: CountRequest = parse_strict(CountRequest, json_body(request), NEUTRAL)
    spec, ttl_s = req.admission(owner, services().settings)
    job = run_one((spec, ttl_s), "messages")
    return jsonify({"input_tokens": job.usage.prompt_tokens})


def _stream(admission: tuple[JobSpec, float], cached: bool, kept: bool) -> Response:
    svc = services()
    spec, ttl_s = admission
    (job,), (feed,) = admit_followed(svc.store, svc.hub, [(new_job_id(), spec)], ttl_s, "messages")
    story = follow(svc.store, svc.hub, job, ping_s=svc.settings.sse_ping_s, environ=request.environ, feed=feed)
    return sse.response(_events(job, MessageBody(job, cached, kept), story), {"x-onelane-job-id": job.id}, feed.close)


def _events(job: Job, body: MessageBody, story: Any) -> Any:
    """Anthropic's events for the job's story (see web/anthropic/body.py); a client that leaves before the end has
    the job cancelled; a job that ends otherwise sends an `error` event."""
    store, ended = services().store, False
    try:
        yield body.start()
        with closing(story):
            for item in story:
                match item:
                    case Gone():
                        return
                    case Queued() | Ping():
                        yield sse.event("ping", {"type": "ping"})
                    case Event(type=EventType.TOKEN):
                        yield from body.deltas(item)
                    case Event(type=EventType.COMPLETED):
                        ended = True
                        yield from body.end(item)
                        return
                    case Event() if item.terminal:
                        ended = True
                        error = job_error(store.get(job.id), store.settings.model_retry_s)
                        yield sse.event(
                            "error",
                            anthropic_error(
                                shown_status(status_for(error), "anthropic"), shown_message(error, "anthropic")
                            ),
                        )
                        return
    finally:
        if not ended:
            cancel_all(store, [job], CLIENT_GONE)
