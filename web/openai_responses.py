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
from typing import Any

from flask import Blueprint, Response, jsonify, request

from tasks.errors import (
    InvalidParameter,
    InvalidRequest,
    JobAlreadyEnded,
    JobNotFound,
    PreviousResponseNotFound,
)
from tasks.events import Event, EventType
from tasks.job import Job, JobStatus, Message, new_job_id
from tasks.logprobs import TokenLogprob, read_entries
from tasks.structured import CallReader, Delta
from web import openai_logprobs, sse
from web.admission import admit
from web.api import CANCEL_WAIT_S, list_limit
from web.auth import current_owner
from web.errors import job_error
from web.feed import Feed
from web.follow import CLIENT_GONE, Gone, Story, cancel_quietly, follow, with_asides
from web.openai_bodies import (
    PREFIX,
    call_state,
    function_call,
    item_id,
    items_of,
    list_page,
    makes_calls,
    message,
    part,
    snapshot,
    status_of,
)
from web.openai_schemas import RESPONSE_NEUTRAL, ResponseRequest, conversation_of, input_of, parse_openai
from web.schemas import json_body
from web.services import services

bp = Blueprint("responses", __name__)


def _own(rid: str) -> Job:
    """The caller's response `rid` (another user's, or a job made otherwise, is not found)."""
    with contextlib.suppress(JobNotFound):
        if rid.startswith(PREFIX):
            job = services().store.get("job_" + rid.removeprefix(PREFIX), current_owner())
            if job.spec.response is not None:
                return job
    raise JobNotFound(f"no response {reprlib.repr(rid)}")  # (a bounded excerpt of what was sent)


@bp.post("/v1/responses")
def create() -> Response:
    owner = current_owner()
    req: ResponseRequest = parse_openai(ResponseRequest, json_body(request), RESPONSE_NEUTRAL)
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
    except JobNotFound:
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
def retrieve(rid: str) -> Response:
    job = _own(rid)
    if not _flag(request.args.get("stream", "false")):
        services().store.keep_watching(job)
        return jsonify(snapshot(job))
    after = _starting_after()
    svc = services()
    story = follow(svc.store, svc.hub, job, ping_s=svc.settings.sse_ping_s)  # (it watches, but cancels nothing)
    return sse.response(ResponseStream(job, after).events(story), {"x-onelane-job-id": job.id})


@bp.get("/v1/responses/<rid>/input_items")
def input_items(rid: str) -> Response:
    """The conversation a response answered (its instructions apart), newest first unless `order=asc`: messages,
    the calls an assistant made, and their outputs."""
    job = _own(rid)
    items = [item for n, turn in enumerate(input_of(job)) for item in items_of(job, n, turn)]
    order = request.args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidParameter("order must be asc or desc", param="order")
    if order == "desc":
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
def cancel(rid: str) -> Response:
    """Cancel a response: queued, it never runs; running, it stops within a step. Again, or once it ended: the
    response as it is."""
    job = _own(rid)
    if not job.spec.response.background:  # type: ignore[union-attr]
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
                raise job_error(ended)
            return jsonify(snapshot(ended))
    raise job_error(services().store.get(job.id))


# --- the stream ---------------------------------------------------------------------------------------------------


class ResponseStream:
    """A response's stream events from its job's story, numbered from 0; those up to `after` are left out.

    Every event is a function of the job's log (its place there, and the text before it), never of when the stream
    was opened, so the numbering is the same on every stream of one job: position updates go as SSE comments,
    unnumbered. created, queued; at the first start: in_progress, and (unless the answer may hold calls)
    output_item.added and content_part.added of the message; a delta per token event with text (a run after a
    requeue goes on from what was written: worker/resume.py); at the end output_text.done, content_part.done,
    output_item.done and completed or incomplete, or else failed (failed, expired, cancelled: the response's own
    status says which).

    Under `tools`, a CallReader fed each token event's text tells words from calls: words open the message as they
    come; each call is an item of its own (output_item.added with its name, function_call_arguments.delta with each
    piece of its arguments, function_call_arguments.done and output_item.done once the next call begins or the
    answer ends). The reader reads the log alone, so these events are numbered as the others.

    With `include` message.output_text.logprobs, each text delta carries its tokens' log probabilities (those of
    tokens whose text was held back, with the next delta), output_text.done and the final response all of them.
    """

    def __init__(self, job: Job, after: int = -1, watcher: bool = False) -> None:
        """`watcher`: this stream is the request a foreground response ends with (its end cancels the job)."""
        self.job, self.after, self.watcher = job, after, watcher
        self.seq = -1
        self.text = ""  # the answer so far, as written
        self.words = ""  # the message's text so far
        self.started = False
        self.reader = CallReader() if makes_calls(job) else None
        self.items: list[dict[str, Any]] = []  # the output items begun, in order; the last one may be open
        self.open = False
        self.shows_logprobs = job.spec.params.logprobs
        self.pending: list[TokenLogprob] = []  # tokens no delta has carried yet
        self.logprobs: list[dict[str, Any]] = []  # the message's so far

    def _event(self, kind: str, **fields: Any) -> Iterator[str]:
        self.seq += 1
        if self.seq > self.after:
            yield sse.event(kind, {"type": kind, "sequence_number": self.seq, **fields})

    def _where(self) -> dict[str, Any]:
        return {"item_id": item_id(self.job), "output_index": self._message_index(), "content_index": 0}

    def _message_index(self) -> int:
        return next(i for i, item in enumerate(self.items) if item["type"] == "message")

    def events(self, story: Iterator[Story]) -> Iterator[str]:
        ended = False
        try:
            yield from self._event("response.created", response=snapshot(self.job, "queued", ""))
            yield from self._event("response.queued", response=snapshot(self.job, "queued", ""))
            for item in with_asides(story):
                match item:
                    case str():
                        yield item
                    case Event() if item.terminal:
                        ended = True
                        yield from self._end(item)
                        return
                    case Event():
                        yield from self._on(item)
        finally:
            if not ended and self.watcher:
                cancel_quietly(services().store, self.job, CLIENT_GONE)

    def _on(self, event: Event) -> Iterator[str]:
        if event.type is EventType.STARTED and not self.started:
            self.started = True
            yield from self._event("response.in_progress", response=snapshot(self.job, "in_progress", ""))
            if self.reader is None:
                yield from self._begin_message()
        elif event.type is EventType.TOKEN:
            self.pending += read_entries(event.logprobs) if self.shows_logprobs else []
            if not event.text:  # (tokens whose text is held back: their log probabilities go with the next delta)
                return
            self.text += event.text
            if self.reader is None:
                yield from self._words(event.text)
            else:
                for delta in self.reader.feed(event.text):
                    yield from self._told(delta)

    def _told(self, delta: Delta) -> Iterator[str]:
        """What a piece of an answer that may hold calls tells: words, a call begun, or more of its arguments."""
        if delta.name is not None:
            yield from self._close("completed")
            self.items.append(function_call(self.job, delta.index, delta.name, "", "in_progress"))
            self.open = True
            yield from self._event("response.output_item.added", output_index=len(self.items) - 1, item=self.items[-1])
        elif delta.arguments:
            call = self.items[-1]
            call["arguments"] += delta.arguments
            where = {"item_id": call["id"], "output_index": len(self.items) - 1}
            yield from self._event("response.function_call_arguments.delta", **where, delta=delta.arguments)
        elif delta.text:
            if not any(item["type"] == "message" for item in self.items):
                yield from self._begin_message()
            yield from self._words(delta.text)

    def _begin_message(self) -> Iterator[str]:
        self.items.append(message(self.job, "", "in_progress"))
        self.open = True
        yield from self._event(
            "response.output_item.added", output_index=len(self.items) - 1, item={**self.items[-1], "content": []}
        )
        yield from self._event("response.content_part.added", **self._where(), part=part(""))

    def _words(self, text: str) -> Iterator[str]:
        self.words += text
        logprobs, self.pending = openai_logprobs.content(self.pending), []
        self.logprobs += logprobs
        yield from self._event("response.output_text.delta", **self._where(), delta=text, logprobs=logprobs)

    def _close(self, status: str) -> Iterator[str]:
        """The open item's last events: its text or its arguments whole, then the item as it ended."""
        if not self.open:
            return
        self.open = False
        index, item = len(self.items) - 1, self.items[-1]
        if item["type"] == "message":
            self.logprobs += openai_logprobs.content(self.pending)  # (tokens whose text never came)
            self.pending, where, logprobs = [], self._where(), self.logprobs
            yield from self._event("response.output_text.done", **where, text=self.words, logprobs=logprobs)
            yield from self._event("response.content_part.done", **where, part=part(self.words, logprobs))
            done = message(self.job, self.words, status, logprobs)
        else:
            name, arguments = item["name"], item["arguments"]
            where = {"item_id": item["id"], "output_index": index}
            yield from self._event("response.function_call_arguments.done", **where, name=name, arguments=arguments)
            done = {**item, "status": call_state(self.text, name, arguments, status)}
        yield from self._event("response.output_item.done", output_index=index, item=done)

    def _end(self, event: Event) -> Iterator[str]:
        job = services().store.get(self.job.id)
        if event.type is not EventType.COMPLETED:
            yield from self._event("response.failed", response=snapshot(job))
            return
        status = status_of(job)
        for delta in self.reader.feed("", final=True) if self.reader is not None else []:  # what it held back
            yield from self._told(delta)
        if not self.items:
            yield from self._begin_message()  # an answer of nothing: an empty message, as the response shows it
        yield from self._close("completed" if status == "completed" else "incomplete")
        yield from self._event(f"response.{status}", response=snapshot(job, status, self.text))
