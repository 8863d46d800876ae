"""Anthropic's wire format for a job's answer: a `message` whole, or its stream of events.

An answer is words (one `text` block) or calls (one `tool_use` block each: the grammar makes it one or the other,
tasks/structured.py). Whole, a call cut short (by `max_tokens`, or a stop sequence) is left out rather than handed
back with an input that is not yet JSON of its schema: the stop reason (`max_tokens`, `stop_sequence`) tells why it
ended. Streamed, its pieces went out as they came, as Anthropic's do: its block is the last, the stop reason the
same. Streamed, in Anthropic's order: `message_start`, then per block `content_block_start`, its
deltas (`text_delta`, or `input_json_delta` pieces of the call's input as they are generated), `content_block_stop`;
then `message_delta` (the stop reason and the usage, all counts final) and `message_stop`; `ping` while the job
waits. Usage: `input_tokens` the prompt's tokens neither read from the prefix cache nor written to it,
`cache_read_input_tokens` those read from it, `cache_creation_input_tokens` those a request that marks
`cache_control` had written to it (the worker keeps the KV state of every completed answer, per owner: marked, it is
told; unmarked, they count as input), `output_tokens` the answer's.
"""

from __future__ import annotations

import json
from typing import Any

from tasks.events import Event
from tasks.job import Job, Usage
from tasks.structured import CallReader, Piece, read_calls
from web import sse

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def tool_use_id(job_id: str, index: int) -> str:
    """A call's id: the same whenever the job is read, streamed or not."""
    return f"toolu_{job_id.removeprefix('job_')[:16]}_{index}"


def usage(u: Usage, cached: bool, kept: bool = True) -> dict[str, Any]:
    """Anthropic's usage of an answer (`cached`: its request marked cache_control; `kept`: the worker's prefix cache
    keeps KV states)."""
    created = u.prompt_tokens - u.cached_tokens if cached and kept else 0
    return {
        "input_tokens": u.prompt_tokens - u.cached_tokens - created,
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": u.cached_tokens,
        "output_tokens": u.completion_tokens,
        "service_tier": "standard",
    }


def stop_reason(finish_reason: str | None, calls: bool, stop_sequence: str | None = None) -> str | None:
    """An answer that ended by making calls stops with `tool_use`, one that ended at a stop string with
    `stop_sequence`, as Anthropic's."""
    if finish_reason == "stop" and stop_sequence:
        return "stop_sequence"
    return "tool_use" if calls and finish_reason == "stop" else STOP_REASONS.get(finish_reason or "")


class MessageBody:
    """One job's answer as an Anthropic `message`, whole or as its events."""

    def __init__(self, job: Job, cached: bool, kept: bool) -> None:
        self.id = "msg_" + job.id.removeprefix("job_")
        self.job_id, self.model, self.constraint = job.id, job.spec.model, job.spec.constraint
        self.cached, self.kept = cached, kept
        self.calls = CallReader() if self.constraint is not None and self.constraint.kind == "tools" else None
        self.block: str | None = None  # the kind of the block open in a stream (text, tool_use), if any
        self.blocks = 0  # blocks begun in a stream

    def whole(self, job: Job) -> dict[str, Any]:
        """The completed job's answer."""
        words, calls = read_calls(job.output, self.constraint, finished=True)
        content: list[dict[str, Any]] = [{"type": "text", "text": words}] if words or not calls else []
        content += [self._tool_use(i, name, json.loads(arguments)) for i, (name, arguments) in enumerate(calls)]
        return {
            **self._envelope(content),
            "stop_reason": stop_reason(job.finish_reason, bool(calls), job.stop_sequence),
            "stop_sequence": job.stop_sequence,
            "usage": usage(job.usage, self.cached, self.kept),
        }

    def _envelope(self, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
        }

    def _tool_use(self, index: int, name: str, arguments: Any) -> dict[str, Any]:
        return {"type": "tool_use", "id": tool_use_id(self.job_id, index), "name": name, "input": arguments}

    # --- streamed ----------------------------------------------------------------------------------------------

    def start(self) -> str:
        """The stream's first event (the counts are told at its end, in message_delta)."""
        message = {**self._envelope([]), "usage": usage(Usage(), self.cached, self.kept)}
        return sse.event("message_start", {"type": "message_start", "message": message})

    def deltas(self, event: Event) -> list[str]:
        """The events for a token event's text: words, or the calls it begins and their input's pieces."""
        if self.calls is None:
            return self._text(event.text) if event.text else []
        return [line for d in self.calls.feed(event.text) for line in self._delta(d)]

    def end(self, end: Event) -> list[str]:
        """What the call reader still held, the last block's end, the stop reason and usage, and message_stop."""
        held = [line for d in self.calls.feed("", final=True) for line in self._delta(d)] if self.calls else []
        if self.blocks == 0:  # an empty answer is one empty text block, as Anthropic's
            held += self._open("text", {"type": "text", "text": ""})
        made = bool(self.calls and self.calls.calls)
        counts = Usage(
            prompt_tokens=end.prompt_tokens, completion_tokens=end.completion_tokens, cached_tokens=end.cached_tokens
        )
        delta = {
            "type": "message_delta",
            "delta": {
                "stop_reason": stop_reason(end.finish_reason, made, end.stop_sequence),
                "stop_sequence": end.stop_sequence,
            },
            "usage": usage(counts, self.cached, self.kept),
        }
        return [
            *held,
            *self._close(),
            sse.event("message_delta", delta),
            sse.event("message_stop", {"type": "message_stop"}),
        ]

    def _text(self, text: str) -> list[str]:
        opened = self._open("text", {"type": "text", "text": ""}) if self.block != "text" else []
        piece = {"type": "content_block_delta", "index": self.blocks - 1, "delta": {"type": "text_delta", "text": text}}
        return [*opened, sse.event("content_block_delta", piece)]

    def _delta(self, d: Piece) -> list[str]:
        if d.name is not None:
            return self._open("tool_use", self._tool_use(d.index, d.name, {}))
        if d.arguments:
            delta = {"type": "input_json_delta", "partial_json": d.arguments}
            piece = {"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}
            return [sse.event("content_block_delta", piece)]
        return self._text(d.text) if d.text else []

    def _open(self, kind: str, block: dict[str, Any]) -> list[str]:
        closed = self._close()
        self.block, self.blocks = kind, self.blocks + 1
        begun = {"type": "content_block_start", "index": self.blocks - 1, "content_block": block}
        return [*closed, sse.event("content_block_start", begun)]

    def _close(self) -> list[str]:
        if self.block is None:
            return []
        self.block = None
        return [sse.event("content_block_stop", {"type": "content_block_stop", "index": self.blocks - 1})]
