"""OpenAI-compatible endpoints on the queue: /v1/models, /v1/chat/completions, /v1/completions.

Each request is a job in the same queue (same bounds, quotas, fairness, TTL). The client's connection is the
watcher: a client that hangs up, streaming or not, gets its job cancelled (skipped if it still waits, stopped
within a step if it runs). The requests' models are in web/openai_schemas.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, jsonify, request

from tasks.errors import JobDidNotComplete
from tasks.events import Event, EventType
from tasks.job import Job, JobSpec, Usage, new_job_id
from web import sse
from web.admission import admit
from web.auth import current_owner
from web.errors import openai_error
from web.feed import Feed
from web.follow import CLIENT_GONE, Gone, Story, cancel_quietly, follow, with_asides
from web.openai_bodies import Chat, Text, usage_object
from web.openai_schemas import ChatRequest, CompletionRequest, Sampling, parse_openai
from web.schemas import json_body
from web.services import services

bp = Blueprint("openai", __name__)

DONE = "data: [DONE]\n\n"  # the last line of an OpenAI stream


@bp.get("/v1/models")
def models() -> Response:
    current_owner()
    catalog = services().settings.catalog  # in the order the models file names them
    return jsonify(
        {
            "object": "list",
            "data": [{"id": m.name, "object": "model", "created": 0, "owned_by": "onelane"} for m in catalog],
        }
    )


@bp.post("/v1/chat/completions")
def chat_completions() -> Response:
    owner = current_owner()  # who is asking (and may they), before what they ask
    req: ChatRequest = parse_openai(ChatRequest, json_body(request))
    spec = req.admission(owner, services().settings)
    return _admit_and_respond(spec, Chat, req)


@bp.post("/v1/completions")
def completions() -> Response:
    owner = current_owner()
    req: CompletionRequest = parse_openai(CompletionRequest, json_body(request))
    spec = req.admission(owner, services().settings)
    return _admit_and_respond(spec, Text, req)


def _usage(end: Event) -> dict[str, Any]:
    """OpenAI's usage object, from a job's terminal event."""
    return usage_object(
        Usage(prompt_tokens=end.prompt_tokens, completion_tokens=end.completion_tokens, cached_tokens=end.cached_tokens)
    )


def _headers(job: Job, queued_s: float | None = None) -> dict[str, str]:
    headers = {"x-onelane-job-id": job.id}
    if queued_s is not None:
        headers["x-queue-time"] = f"{queued_s:.3f}"
    return headers


def _admit_and_respond(admission: tuple[JobSpec, float], view_class: type[Chat], req: Sampling) -> Response:
    """Admit the job and answer with its story. Its feed subscribes first, so that, once admitted, the job's
    events all arrive live and nothing is read back before the first token."""
    svc = services()
    job_id = new_job_id()
    feed = Feed(svc.store, svc.hub, job_id, replay=False)
    try:
        job = admit(*admission, job_id=job_id)
    except BaseException:
        feed.close()
        raise
    story = follow(svc.store, svc.hub, job, ping_s=svc.settings.sse_ping_s, environ=request.environ, feed=feed)
    view = view_class(job, req)
    if req.stream:  # the feed closes with the response, also when the stream never started (twice is harmless)
        return sse.response(_stream(job, view, story), _headers(job), on_close=feed.close)
    return _respond(job, view, story)


def _respond(job: Job, view: Chat, story: Iterator[Story]) -> Response:
    """The whole answer at once, put together from the job's events as they come (nothing is read back)."""
    output: list[str] = []
    queued_s: float | None = None
    for item in story:
        match item:
            case Gone():
                cancel_quietly(services().store, job, CLIENT_GONE)
                return Response(status=499)  # nobody reads it; the job was cancelled
            case Event(type=EventType.STARTED) if queued_s is None:  # (again after a requeue: it goes on)
                queued_s = item.queued_s
            case Event(type=EventType.TOKEN):
                output.append(item.text)
            case Event(type=EventType.COMPLETED):  # the terminal event has the finish reason and the counts
                choice = view.choice("".join(output), item.finish_reason, False)
                response = jsonify(view.envelope(view.object, [choice], _usage(item)))
                response.headers.update(_headers(job, queued_s))
                return response
    raise JobDidNotComplete.of(services().store.get(job.id))


def _stream(job: Job, view: Chat, story: Iterator[Story]) -> Iterator[str]:
    """OpenAI's SSE: `data: {chunk}` lines, queue position as comments, `data: [DONE]` at the end. A client that
    leaves before the end has its job cancelled. If the job's worker dies mid-answer, its next run goes on from the
    tokens written (worker/resume.py), and so does the stream."""
    ended = False
    try:
        first = view.first_chunk()
        if first is not None:
            yield sse.data_line(first)
        for item in with_asides(story):
            match item:
                case str():
                    yield item
                case Event(type=EventType.TOKEN) if item.text:
                    for choice in view.deltas(item.text):
                        yield sse.data_line(view.envelope(view.chunk_object(), [choice], None))
                case Event(type=EventType.COMPLETED):  # the terminal event has what the last chunks need
                    ended = True
                    for choice in view.last(item.finish_reason):
                        yield sse.data_line(view.envelope(view.chunk_object(), [choice], None))
                    if view.include_usage:
                        yield sse.data_line(view.envelope(view.chunk_object(), [], _usage(item)))
                    yield DONE
                    return
                case Event() if item.terminal:
                    ended = True
                    yield sse.data_line({"error": openai_error(JobDidNotComplete.of(services().store.get(job.id)))})
                    yield DONE
                    return
    finally:
        if not ended:
            cancel_quietly(services().store, job, CLIENT_GONE)
