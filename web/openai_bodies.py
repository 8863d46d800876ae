"""OpenAI's wire formats for a job, as the endpoints answer it: chat.completion, text_completion, response.

Shared by the endpoints (web/openai_compat.py, web/openai_responses.py) and by a batch's result lines
(web/batch_runner.py). How a response's status follows its job's is told in web/openai_responses.py.
"""

from __future__ import annotations

from typing import Any

from tasks.job import Job, JobStatus, Message, ResponseFields, Usage
from tasks.structured import CallReader, Delta, ToolCall, call_id, read_calls, render_call
from web.openai_schemas import RESPONSE_ECHO, Sampling


class Chat:
    """The chat.completion wire format for one job."""

    object = "chat.completion"
    prefix = "chatcmpl-"
    echoes_tier = True  # as OpenAI's: the service tier the job got

    def __init__(self, job: Job, req: Sampling | None = None) -> None:
        self.id = self.prefix + job.id.removeprefix("job_")
        self.job_id = job.id
        self.constraint = job.spec.constraint
        self.calls = CallReader() if makes_calls(job) else None
        self.model = job.spec.model
        self.created = int(job.timings.queued_at)
        self.include_usage = bool(req and req.stream_options and req.stream_options.include_usage)
        asked_priority = req is not None and req.service_tier == "priority"
        self.tier = "flex" if job.spec.priority == "batch" else "priority" if asked_priority else "default"

    def body(self, job: Job) -> dict[str, Any]:
        """The whole answer of a completed job, as read back from its record (a batch's line's)."""
        choice = self.choice(job.output, job.finish_reason, False)
        return self.envelope(self.object, [choice], usage_object(job.usage))

    def envelope(self, obj: str, choices: list[dict[str, Any]], usage: dict[str, int] | None) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "object": obj, "created": self.created, "model": self.model}
        if self.echoes_tier:
            body["service_tier"] = self.tier
        body["choices"] = choices
        if usage is not None or obj == self.object or self.include_usage:
            body["usage"] = usage
        return body

    def choice(self, text: str, finish_reason: str | None, delta: bool) -> dict[str, Any]:
        """The whole answer (`delta` False) or a piece of a stream; an answer with tool calls as OpenAI's."""
        if not delta:
            words, calls = read_calls(text, self.constraint)
            message: dict[str, Any] = {"role": "assistant", "content": words}
            if calls:
                message["content"] = words or None
                message["tool_calls"] = [self._call(i, name, arguments) for i, (name, arguments) in enumerate(calls)]
            return {"index": 0, "message": message, "logprobs": None, "finish_reason": _reason(finish_reason, calls)}
        return {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish_reason}

    def deltas(self, text: str) -> list[dict[str, Any]]:
        """The chunks' choices for a piece of a stream: its words, or the calls it begins and their arguments."""
        if self.calls is None:
            return [self.choice(text, None, True)] if text else []
        return [self._delta(d) for d in self.calls.feed(text)]

    def last(self, finish_reason: str | None) -> list[dict[str, Any]]:
        """The stream's last choices: what the call reader still held, then the finish reason."""
        held = [self._delta(d) for d in self.calls.feed("", final=True)] if self.calls is not None else []
        reason = _reason(finish_reason, self.calls.calls if self.calls is not None else [])
        return [*held, {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}]

    def _call(self, index: int, name: str, arguments: str) -> dict[str, Any]:
        return {
            "id": call_id(self.job_id, index),
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }

    def _delta(self, d: Delta) -> dict[str, Any]:
        if d.name is not None:
            call = {"index": d.index, **self._call(d.index, d.name, "")}
            delta: dict[str, Any] = {"tool_calls": [call]}
        elif d.arguments:
            delta = {"tool_calls": [{"index": d.index, "function": {"arguments": d.arguments}}]}
        else:
            delta = {"content": d.text}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}

    def chunk_object(self) -> str:
        return self.object + ".chunk"

    def first_chunk(self) -> dict[str, Any] | None:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return self.envelope(self.chunk_object(), [choice], None)


class Text(Chat):
    """The text_completion wire format for one job."""

    object = "text_completion"
    prefix = "cmpl-"
    echoes_tier = False  # OpenAI's legacy completions have no service tier

    def choice(self, text: str, finish_reason: str | None, delta: bool) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def last(self, finish_reason: str | None) -> list[dict[str, Any]]:
        return [self.choice("", finish_reason, True)]

    def chunk_object(self) -> str:
        return self.object

    def first_chunk(self) -> dict[str, Any] | None:
        return None


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


# --- the response object ----------------------------------------------------------------------------------------------


PREFIX = "resp_"
TIER_NAMES = {"batch": "flex", "interactive": "default"}


def response_id(job_id: str) -> str:
    return PREFIX + job_id.removeprefix("job_")


def status_of(job: Job) -> str:
    if job.status is JobStatus.COMPLETED:
        return "incomplete" if job.finish_reason == "length" else "completed"
    return "failed" if job.status is JobStatus.EXPIRED else job.status.value


def snapshot(job: Job, status: str | None = None, text: str | None = None) -> dict[str, Any]:
    """The response object for `job` as it stands (or as a stream tells it: `status`, with `text` so far)."""
    status = status or status_of(job)
    text = job.output if text is None else text
    extra, params = job.spec.response or ResponseFields(), job.spec.params
    echo = {**RESPONSE_ECHO, **extra.echo}
    ended = status not in ("queued", "in_progress")
    error = None
    if status == "failed":
        error = {
            "code": job.error.type if job.error else job.status.value,
            "message": job.error.message if job.error else f"the job {job.status.value}",
        }
    return {
        "id": response_id(job.id),
        "object": "response",
        "created_at": int(job.timings.queued_at),
        "status": status,
        "background": extra.background,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": extra.instructions,
        "max_output_tokens": params.max_tokens,
        "metadata": extra.metadata,
        "model": job.spec.model,
        "output": output_of(job, status, text),
        "parallel_tool_calls": echo["parallel_tool_calls"],
        "previous_response_id": extra.previous_response_id,
        "service_tier": TIER_NAMES[job.spec.priority] if extra.service_tier != "priority" else "priority",
        "store": True,
        "temperature": params.temperature,
        "text": echo["text"],
        "tool_choice": echo["tool_choice"],
        "tools": echo["tools"],
        "top_p": params.top_p,
        "truncation": "disabled",
        "usage": usage(job) if ended else None,
        "user": None,
    }


def output_of(job: Job, status: str, text: str) -> list[dict[str, Any]]:
    """A response's output items for `text` (its answer so far): the assistant's message, or (under `tools`) the
    calls it made, each an item of its own."""
    ended = status not in ("queued", "in_progress")
    if status == "queued" or (ended and status != "completed" and not text):
        return []  # nothing written (yet, or ever)
    state = "in_progress" if not ended else "completed" if status == "completed" else "incomplete"
    if not makes_calls(job):
        return [message(job, text, state)]
    reader = CallReader()
    words = "".join(d.text for d in reader.feed(text, final=ended))
    items = [message(job, words, state)] if words or (ended and not reader.calls) else []
    for i, (name, arguments) in enumerate(reader.calls):
        items.append(function_call(job, i, name, arguments, call_state(text, name, arguments, state)))
    return items


def call_state(text: str, name: str, arguments: str, state: str) -> str:
    """A call's status: `completed` once the answer `text` holds it whole, else its response's (`state`)."""
    return "completed" if render_call(ToolCall(id="", name=name, arguments=arguments)) in text else state


def makes_calls(job: Job) -> bool:
    """The job's answer may hold tool calls (its request gave tools the model may call)."""
    return job.spec.constraint is not None and job.spec.constraint.kind == "tools"


def message(job: Job, text: str, status: str) -> dict[str, Any]:
    """The assistant's message: the response's output item, unless it made calls."""
    return {"id": item_id(job), "type": "message", "status": status, "role": "assistant", "content": [part(text)]}


def item_id(job: Job) -> str:
    return "msg_" + job.id.removeprefix("job_")


def part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call(job: Job, index: int, name: str, arguments: str, status: str) -> dict[str, Any]:
    """The `index`th call the answer made, an output item (its `call_id` is the one a function_call_output names)."""
    return {
        "id": f"fc_{job.id.removeprefix('job_')}_{index}",
        "type": "function_call",
        "status": status,
        "call_id": call_id(job.id, index),
        "name": name,
        "arguments": arguments,
    }


def items_of(job: Job, n: int, turn: Message) -> list[dict[str, Any]]:
    """The items the `n`th message of a response's input was (as OpenAI lists them): a message (the assistant's as
    output text), each call an assistant's made, or a tool's answer as a function_call_output."""
    place = f"{job.id.removeprefix('job_')}_{n}"
    if turn.role == "tool":
        output = {"type": "function_call_output", "call_id": turn.tool_call_id or "", "output": turn.content}
        return [{"id": f"fco_{place}", **output, "status": "completed"}]
    items = []
    if turn.content or not turn.tool_calls:  # (calls alone: no message said anything)
        text = part(turn.content) if turn.role == "assistant" else {"type": "input_text", "text": turn.content}
        items.append(
            {"id": f"msg_{place}", "type": "message", "role": turn.role, "status": "completed", "content": [text]}
        )
    for k, call in enumerate(turn.tool_calls):
        fields = {"call_id": call.id, "name": call.name, "arguments": call.arguments}
        items.append({"id": f"fc_{place}_{k}", "type": "function_call", "status": "completed", **fields})
    return items


def list_page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """One page of an OpenAI list, with its cursors."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def usage(job: Job) -> dict[str, Any]:
    u = job.usage
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.total_tokens,
    }
