"""OpenAI's wire formats for a job's answer, as the chat and completions endpoints give it
(web/openai/chat/routes.py) and a batch's result lines (web/openai/batches/runner.py): chat.completion and
text_completion, whole or streamed; their usage; and a page of an OpenAI list. The Responses API's object is
web/openai/responses/body.py's.
"""

from __future__ import annotations

from typing import Any

from tasks.events import Event
from tasks.job import Job, Usage
from tasks.logprobs import TokenLogprob, read_entries, read_prompt
from tasks.structured import CallReader, Piece, call_id, read_calls
from web.openai import logprobs as openai_logprobs
from web.openai.body import makes_calls
from web.openai.chat.sampling import Sampling
from web.openai.logprobs import Offsets


class ChatBody:
    """The chat.completion wire format for one answer (one job): whole, or as the pieces of a stream.

    The answers of one request (`n`) share the first one's id, each with its own `index`. Log probabilities, when the
    request asked for them, come with each piece of a stream: the tokens a piece of text was made of come with it,
    and those whose text is held back (part of a character, or of a call's syntax) with the next piece that has any,
    at the latest with the finish reason's."""

    object = "chat.completion"
    prefix = "chatcmpl-"
    echoes_tier = True  # as OpenAI's: the service tier the job got

    def __init__(self, job: Job, req: Sampling | None = None) -> None:
        choice = job.spec.choice
        self.id = self.prefix + (choice.group if choice else job.id).removeprefix("job_")
        self.index = choice.index if choice else 0
        self.job_id = job.id
        self.constraint = job.spec.constraint
        self.calls = CallReader() if makes_calls(job) else None
        self.model = job.spec.model
        self.created = int(job.timings.queued_at)
        self.include_usage = bool(req and req.stream_options and req.stream_options.include_usage)
        asked_priority = req is not None and req.service_tier == "priority"
        self.tier = "flex" if job.spec.priority == "batch" else "priority" if asked_priority else "default"
        # (best_of's answers record them to be ranked, asked or not: the request says whether they are shown)
        self.shows_logprobs = job.spec.params.logprobs if req is None else req.shows_logprobs()
        self.pending: list[TokenLogprob] = []  # tokens whose log probabilities no piece has carried yet

    def body(self, job: Job) -> dict[str, Any]:
        """The whole answer of a completed job, as read back from its record (a batch's line's)."""
        return self.envelope(self.object, [self.whole(job)], usage_object(job.usage))

    def envelope(self, obj: str, choices: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "object": obj, "created": self.created, "model": self.model}
        if self.echoes_tier:
            body["service_tier"] = self.tier
        body["choices"] = choices
        if usage is not None or obj == self.object or self.include_usage:
            body["usage"] = usage
        return body

    def whole(self, job: Job, index: int | None = None) -> dict[str, Any]:
        """The completed job's answer as a choice (at `index`: its own unless re-ranked, as best_of's); an answer
        with tool calls as OpenAI's."""
        words, calls = read_calls(job.output, self.constraint)
        message: dict[str, Any] = {"role": "assistant", "content": words}
        if calls:
            message["content"] = words or None
            message["tool_calls"] = [self._call(i, name, arguments) for i, (name, arguments) in enumerate(calls)]
        logprobs = openai_logprobs.chat(read_entries(job.logprobs)) if self.shows_logprobs else None
        reason = _reason(job.finish_reason, calls)
        return {
            "index": self.index if index is None else index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": reason,
        }

    def deltas(self, event: Event) -> list[dict[str, Any]]:
        """The chunks' choices for a token event: its words, or the calls it begins and their arguments."""
        if self.shows_logprobs:
            self.pending += read_entries(event.logprobs)
        if self.calls is None:
            return [self._piece({"content": event.text})] if event.text else []
        return [self._piece(self._delta(d)) for d in self.calls.feed(event.text)]

    def last(self, finish_reason: str | None) -> list[dict[str, Any]]:
        """The stream's last choices: what the call reader still held, then the finish reason."""
        held = [self._piece(self._delta(d)) for d in self.calls.feed("", final=True)] if self.calls is not None else []
        reason = _reason(finish_reason, self.calls.calls if self.calls is not None else [])
        return [*held, self._piece({}, reason)]

    def _piece(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        """A chunk's choice, with the log probabilities not yet carried (if asked for)."""
        logprobs = None
        if self.shows_logprobs:
            logprobs, self.pending = openai_logprobs.chat(self.pending), []
        return {"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

    def _call(self, index: int, name: str, arguments: str) -> dict[str, Any]:
        return {
            "id": call_id(self.job_id, index),
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    def _delta(self, d: Piece) -> dict[str, Any]:
        if d.name is not None:
            return {"tool_calls": [{"index": d.index, **self._call(d.index, d.name, "")}]}
        if d.arguments:
            return {"tool_calls": [{"index": d.index, "function": {"arguments": d.arguments}}]}
        return {"content": d.text}

    def chunk_object(self) -> str:
        return self.object + ".chunk"

    def first_chunk(self) -> dict[str, Any] | None:
        role = {"role": "assistant", "content": ""}
        choice = {"index": self.index, "delta": role, "logprobs": None, "finish_reason": None}
        return self.envelope(self.chunk_object(), [choice], None)


class CompletionBody(ChatBody):
    """The text_completion wire format for one answer. With `echo` (which its job records as scoring its prompt),
    the text begins with the prompt, and its log probabilities with the prompt's tokens'; a stream sends the prompt
    with its first piece."""

    object = "text_completion"
    prefix = "cmpl-"
    echoes_tier = False  # OpenAI's legacy completions have no service tier

    def __init__(self, job: Job, req: Sampling | None = None) -> None:
        super().__init__(job, req)
        self.echo = job.spec.prompt if job.spec.params.prompt_logprobs else None  # (to send yet, in a stream)
        self.tops = job.spec.params.top_logprobs > 0  # (`logprobs: 0`: no alternatives, null)
        self.offsets = Offsets()  # a stream's: where its next token begins

    def whole(self, job: Job, index: int | None = None) -> dict[str, Any]:
        text, entries = job.output, read_entries(job.logprobs)
        if self.echo is not None:
            text, entries = self.echo + text, read_prompt(job.prompt_logprobs) + entries
        logprobs = openai_logprobs.legacy(entries, Offsets(), self.tops) if self.shows_logprobs else None
        return {
            "index": self.index if index is None else index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": job.finish_reason,
        }

    def deltas(self, event: Event) -> list[dict[str, Any]]:
        text = event.text
        if self.echo is not None:  # its first token event: the prompt's log probabilities come with it
            text, self.echo = self.echo + text, None
            self.pending += read_prompt(event.prompt_logprobs) if self.shows_logprobs else []
        if self.shows_logprobs:
            self.pending += read_entries(event.logprobs)
        return [self._text(text)] if text else []

    def last(self, finish_reason: str | None) -> list[dict[str, Any]]:
        echoed = [self._text(self.echo)] if self.echo is not None else []  # (no token came: nothing was generated)
        return [*echoed, self._text("", finish_reason)]

    def _text(self, text: str, finish_reason: str | None = None) -> dict[str, Any]:
        logprobs = None
        if self.shows_logprobs:
            logprobs, self.pending = openai_logprobs.legacy(self.pending, self.offsets, self.tops), []
        return {"index": self.index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def chunk_object(self) -> str:
        return self.object

    def first_chunk(self) -> dict[str, Any] | None:
        return None


def total_usage(usages: list[Usage]) -> Usage:
    """The usage of a request of several answers: the prompt once (the first answer's, its cached tokens too), every
    answer's completion tokens."""
    first = usages[0]
    completion = sum(u.completion_tokens for u in usages)
    return Usage(prompt_tokens=first.prompt_tokens, completion_tokens=completion, cached_tokens=first.cached_tokens)


def _reason(finish_reason: str | None, calls: list[tuple[str, str]]) -> str | None:
    """An answer that ended by making calls finishes with `tool_calls`, as OpenAI's."""
    return "tool_calls" if calls and finish_reason == "stop" else finish_reason


def usage_object(u: Usage) -> dict[str, Any]:
    """OpenAI's usage object: the prompt's tokens read from the prefix cache are its
    `prompt_tokens_details.cached_tokens`, as OpenAI reports its own prompt caching."""
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }
