"""A response's stream: its events, numbered from its job's durable log, so that every stream of one response numbers
them the same (web/openai/responses/routes.py serves it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tasks.events import Event, EventType
from tasks.job import Job
from tasks.logprobs import TokenLogprob, read_entries
from tasks.structured import CallReader, Piece
from web import sse
from web.follow import CLIENT_GONE, Story, cancel_quietly, with_asides
from web.openai import logprobs as openai_logprobs
from web.openai.body import makes_calls
from web.openai.responses.body import (
    call_state,
    function_call,
    item_id,
    message,
    part,
    snapshot,
    status_of,
)
from web.services import services


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

    def _told(self, delta: Piece) -> Iterator[str]:
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
