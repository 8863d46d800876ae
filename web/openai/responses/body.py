"""The Responses API's object for a job, as its endpoints (web/openai/responses/routes.py) and a batch's result
lines give it: its status (the job's, as web/openai/responses/routes.py tells), its output items, its input items,
its usage."""

from __future__ import annotations

from typing import Any

from tasks.job import Job, JobStatus, Message, ResponseFields
from tasks.logprobs import read_entries
from tasks.structured import CallReader, ToolCall, call_id, render_call
from web.openai import logprobs as openai_logprobs
from web.openai.body import makes_calls
from web.openai.responses.schemas import RESPONSE_ECHO

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
        "top_logprobs": params.top_logprobs,
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
    # the job's log probabilities are its whole answer's: a stream's snapshots before the end show none
    logprobs = response_logprobs(job) if text == job.output else []
    if not makes_calls(job):
        return [message(job, text, state, logprobs)]
    reader = CallReader()
    words = "".join(d.text for d in reader.feed(text, final=ended))
    # (an answer is words or calls, never both: words have every token; calls have no place for any)
    items = [message(job, words, state, logprobs)] if words or (ended and not reader.calls) else []
    for i, (name, arguments) in enumerate(reader.calls):
        items.append(function_call(job, i, name, arguments, call_state(text, name, arguments, state)))
    return items


def call_state(text: str, name: str, arguments: str, state: str) -> str:
    """A call's status: `completed` once the answer `text` holds it whole, else its response's (`state`)."""
    return "completed" if render_call(ToolCall(id="", name=name, arguments=arguments)) in text else state


def message(job: Job, text: str, status: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The assistant's message: the response's output item, unless it made calls."""
    content = [part(text, logprobs)]
    return {"id": item_id(job), "type": "message", "status": status, "role": "assistant", "content": content}


def response_logprobs(job: Job) -> list[dict[str, Any]]:
    """A response's tokens' log probabilities as its output text shows them (`include` asked for them), else []."""
    return openai_logprobs.content(read_entries(job.logprobs)) if job.spec.params.logprobs else []


def item_id(job: Job) -> str:
    return "msg_" + job.id.removeprefix("job_")


def part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


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


def usage(job: Job) -> dict[str, Any]:
    u = job.usage
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.total_tokens,
    }
