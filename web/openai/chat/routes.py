"""OpenAI-compatible endpoints on the queue: /v1/models, /v1/chat/completions, /v1/completions.

Each request is a job in the same queue (same bounds, quotas, fairness, TTL), or one job per answer with `n` or
`best_of` (web/openai/choices.py). The client's connection is the watcher: a client that hangs up, streaming or not,
gets its jobs cancelled (skipped if they still wait, stopped within a step if they run). The requests' models are in
web/openai/chat/schemas.py, their answers' wire formats in web/openai/chat/body.py.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from contextlib import closing

from flask import Blueprint, Response, jsonify, request

from tasks.errors import Unauthorized, Unavailable
from tasks.events import Event, EventType
from tasks.job import Job, JobSpec, Usage
from web import responses, sse
from web.admission import cancel_all
from web.apidoc import JSON, SSE, Reply, Schema, documented, reply
from web.auth import current_owner
from web.errors import job_error, openai_error
from web.follow import CLIENT_GONE, Gone, Ping, Queued, Story, aside, follow
from web.openai.chat import answers
from web.openai.chat.body import ChatBody, CompletionBody, total_usage, usage_object
from web.openai.chat.sampling import Sampling
from web.openai.chat.schemas import ChatRequest, CompletionRequest
from web.openai.choices import ANOTHER_FAILED, admit_choices, best_of, merged
from web.openai.schemas import NEUTRAL
from web.requests import REQUEST_ERRORS, parse_strict
from web.schemas import json_body
from web.services import services

bp = Blueprint("openai", __name__)

DONE = "data: [DONE]\n\n"  # the last line of an OpenAI stream

CHOICES_NOTE = (
    "`n` answers are a job each (one prompt read for all), admitted all or none, their choices indexed from 0; one "
    "that fails fails the request, and a client that leaves cancels them all. Penalties and `logit_bias` as OpenAI "
    "defines them. "
)


def _stream_note(obj: str) -> str:
    return (
        f'With `"stream": true`, `text/event-stream`: `data: {{chunk}}` lines (`{obj}` objects), '
        "`: queued, position N, eta_s T` comments while the "
        'job waits, a `data: {"error": …}` line if it ends without completing, then `data: [DONE]`.'
    )


def _answer(whole: Schema, chunk: Schema) -> Reply:
    """200: the whole answer as JSON, or (`stream` true) its chunks, as OpenAI streams them."""
    done_or_json = {
        "type": "string",
        "if": {"const": "[DONE]"},
        "else": {"contentMediaType": JSON, "contentSchema": {"anyOf": [chunk, responses.OpenAIError]}},
    }
    stream = {"type": "object", "properties": {"data": done_or_json}, "required": ["data"]}
    return Reply(
        "the whole answer (`stream` false), or its stream",
        {JSON: whole, SSE: stream},
        {"x-onelane-job-id": True, "x-onelane-job-ids": False, "x-queue-time": False},
    )


@bp.get("/v1/models")
@documented(
    "listModels",
    "List the served models",
    "openai",
    answers={200: reply("the models", answers.ModelList)},
    errors=[Unauthorized, Unavailable],
)
def models() -> Response:
    current_owner()
    catalog = services().settings.catalog  # in the order the models file names them
    batching = services().store.readings.batching([m.name for m in catalog])
    images = services().store.readings.images([m.name for m in catalog])
    speculation = services().store.readings.speculation([m.name for m in catalog])
    data = [
        {
            "id": m.name,
            "object": "model",
            "created": 0,
            "owned_by": "onelane",
            "kind": m.kind,
            "vision": m.vision,  # reads images in its prompts
            "batching": batching[m.name] if m.kind == "generate" else None,
            "images": images[m.name] if m.vision else None,
            "speculation": speculation[m.name] if m.kind == "generate" else None,
        }
        for m in catalog
    ]
    return jsonify({"object": "list", "data": data})


@bp.post("/v1/chat/completions")
@documented(
    "createChatCompletion",
    "Create a chat completion",
    "openai",
    description="A job in the same queue, watched by the connection: a client that hangs up gets its job cancelled. "
    "`response_format` (`json_object`, `json_schema`) and `tools` are enforced as the answer is generated, each token "
    "drawn under their grammar: JSON of the schema, or calls (`message.tool_calls`, `finish_reason` `tool_calls`, "
    "`content` null; streamed as `delta.tool_calls`, each call's name, then its arguments in pieces) whose arguments "
    "fit their function's parameters; `tool_choice` `auto` lets the model answer in words instead. "
    + CHOICES_NOTE
    + _stream_note("chat.completion.chunk"),
    body=ChatRequest,
    answers={200: _answer(answers.ChatCompletion, answers.ChatCompletionChunk)},
    errors=REQUEST_ERRORS,
)
def chat_completions() -> Response:
    owner = current_owner()  # who is asking (and may they), before what they ask
    req: ChatRequest = parse_strict(ChatRequest, json_body(request), NEUTRAL)
    spec = req.admission(owner, services().settings)
    return _admit_and_respond(spec, ChatBody, req)


@bp.post("/v1/completions")
@documented(
    "createCompletion",
    "Create a text completion",
    "openai",
    description="As chat completions, for one prompt (`response_format` too, as in vLLM; no tools). `logprobs` N: "
    "each token's log probability and the N likeliest at its place; `echo`: the prompt comes first, with its tokens "
    "(`max_tokens` 0: the prompt scored, nothing generated); `best_of`: that many answers, the `n` of highest mean "
    "log probability per token returned. " + CHOICES_NOTE + _stream_note("text_completion"),
    body=CompletionRequest,
    answers={200: _answer(answers.Completion, answers.CompletionChunk)},
    errors=REQUEST_ERRORS,
)
def completions() -> Response:
    owner = current_owner()
    req: CompletionRequest = parse_strict(CompletionRequest, json_body(request), NEUTRAL)
    spec = req.admission(owner, services().settings)
    return _admit_and_respond(spec, CompletionBody, req)


def _headers(jobs: list[Job], queued_s: float | None = None) -> dict[str, str]:
    headers = {"x-onelane-job-id": jobs[0].id}
    if len(jobs) > 1:
        headers["x-onelane-job-ids"] = ",".join(job.id for job in jobs)
    if queued_s is not None:
        headers["x-queue-time"] = f"{queued_s:.3f}"
    return headers


def _admit_and_respond(admission: tuple[JobSpec, float], view_class: type[ChatBody], req: Sampling) -> Response:
    """Admit the request's jobs (one per answer: web/openai/choices.py) and answer with their stories. Each job's feed
    subscribes first, so that, once admitted, its events all arrive live and nothing is read back before the first
    token."""
    svc = services()
    jobs, feeds = admit_choices(svc.store, svc.hub, *admission, count=req.count(), param=req.count_field())
    stories = [
        follow(svc.store, svc.hub, job, ping_s=svc.settings.sse_ping_s, environ=request.environ, feed=feed)
        for job, feed in zip(jobs, feeds)
    ]
    views = [view_class(job, req) for job in jobs]

    def close() -> None:  # the feeds close with the response, also when the stream never started (twice: harmless)
        for feed in feeds:
            feed.close()

    if req.stream:
        return sse.response(_stream(jobs, views, stories), _headers(jobs), on_close=close)
    try:
        return _respond(jobs, views, req, stories)
    finally:
        close()


def _respond(
    jobs: list[Job], views: list[ChatBody], req: Sampling, stories: list[Generator[Story, None, None]]
) -> Response:
    """The whole answer, once every job completed: each read back whole (its text and log probabilities), as a
    batch's line is; best_of's best `n`, best first."""
    store = services().store
    queued_s: float | None = None
    with closing(merged(stories)) as items:
        for index, item in items:
            match item:
                case Gone():
                    cancel_all(store, jobs, CLIENT_GONE)
                    return Response(status=499)  # nobody reads it; the jobs were cancelled
                case Event(type=EventType.STARTED) if index == 0 and queued_s is None:  # (not again after a requeue)
                    queued_s = item.queued_s
                case Event(type=EventType.COMPLETED):
                    pass
                case Event() if item.terminal:  # one answer failed: so does the request, as a single job's would
                    cancel_all(store, jobs, ANOTHER_FAILED)
                    raise job_error(store.get(jobs[index].id), store.settings.model_retry_s)
    ended = store.read([job.id for job in jobs])
    done = [ended[job.id] for job in jobs]
    shown = best_of(done, req.n or 1) if len(done) > (req.n or 1) else done
    view_of = {view.job_id: view for view in views}
    choices = [view_of[job.id].whole(job, index) for index, job in enumerate(shown)]
    usage = usage_object(total_usage([job.usage for job in done]))
    response = jsonify(views[0].envelope(views[0].object, choices, usage))
    response.headers.update(_headers(jobs, queued_s))
    return response


def _stream(jobs: list[Job], views: list[ChatBody], stories: list[Generator[Story, None, None]]) -> Iterator[str]:
    """OpenAI's SSE: `data: {chunk}` lines (the answers' interleaved as they come, each with its index), queue
    positions as comments, `data: [DONE]` at the end. A client that leaves before the end has every job cancelled.
    If a job's worker dies mid-answer, its next run goes on from the tokens written (worker/resume.py), and so does
    the stream."""
    store, first = services().store, views[0]
    ends: dict[int, Event] = {}  # the answers completed, by index
    why = CLIENT_GONE  # why the others are cancelled, if the stream ends before they do
    items = merged(stories)
    try:
        for view in views:
            chunk = view.first_chunk()
            if chunk is not None:
                yield sse.data_line(chunk)
        for index, item in items:
            match item:
                case Gone():
                    return
                case Queued() | Ping():
                    yield aside(item)
                case Event(type=EventType.TOKEN):
                    for choice in views[index].deltas(item):
                        yield sse.data_line(first.envelope(first.chunk_object(), [choice], None))
                case Event(type=EventType.COMPLETED):  # the terminal event has what the last chunks need
                    ends[index] = item
                    for choice in views[index].last(item.finish_reason):
                        yield sse.data_line(first.envelope(first.chunk_object(), [choice], None))
                case Event() if item.terminal:  # one answer failed: so does the request, as a single job's would
                    why = ANOTHER_FAILED
                    error = job_error(store.get(jobs[index].id), store.settings.model_retry_s)
                    yield sse.data_line({"error": openai_error(error)})
                    yield DONE
                    return
        if first.include_usage:
            usage = usage_object(total_usage([_usage(ends[i]) for i in range(len(jobs))]))
            yield sse.data_line(first.envelope(first.chunk_object(), [], usage))
        yield DONE
    finally:
        items.close()
        if len(ends) < len(jobs):
            cancel_all(store, jobs, why)


def _usage(end: Event) -> Usage:
    """A job's usage, from its terminal event."""
    return Usage(
        prompt_tokens=end.prompt_tokens, completion_tokens=end.completion_tokens, cached_tokens=end.cached_tokens
    )
