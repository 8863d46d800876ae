"""What each route of the API promises, as OpenAPI operations: its body, its answers and their headers, its errors.

Schemas are referred to through `ref(Model)`, which web/openapi.py resolves to the components pydantic wrote.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from tasks.events import EventType
from tasks.settings import Settings
from web import responses
from web.limits import LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX
from web.openai import answers, file_answers, response_answers
from web.openai.batches import BatchRequest
from web.openai.chat_schemas import ChatRequest, CompletionRequest
from web.openai.response_schemas import ResponseRequest
from web.schemas import SubmitJob

Ref = Callable[[type[BaseModel]], dict[str, Any]]  # a model -> {"$ref": its component}

JSON, SSE, TEXT = "application/json", "text/event-stream", "text/plain"
HEADERS = {
    "Retry-After": {"description": "whole seconds until a place should free up", "schema": {"type": "integer"}},
    "Location": {"description": "the job's URL", "schema": {"type": "string"}},
    "WWW-Authenticate": {"description": 'Bearer realm="onelane"', "schema": {"type": "string"}},
    "x-onelane-job-id": {"description": "the job behind this answer (`n`: the first's)", "schema": {"type": "string"}},
    "x-onelane-job-ids": {
        "description": "with several answers (`n`, `best_of`): every job behind them, comma-separated, in order",
        "schema": {"type": "string"},
    },
    "x-queue-time": {"description": "seconds the job waited (non-streaming answers)", "schema": {"type": "string"}},
}


def _in_path(name: str, description: str) -> dict[str, Any]:
    """A path parameter: a string."""
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}, "description": description}


JOB_ID = _in_path("job_id", "the job's id (`job_…`); another user's job is 404, as one that does not exist")
FILE_ID = _in_path("file_id", "the file's id (`file-…`)")
BATCH_ID = _in_path("batch_id", "the batch's id (`batch_…`); another user's batch is 404, as one that does not exist")
RESPONSE_ID = _in_path("rid", "the response's id (`resp_…`)")
LIMIT = {
    "name": "limit",
    "in": "query",
    "description": "how many, newest first",
    "schema": {"type": "integer", "minimum": 1, "maximum": LIST_LIMIT_MAX, "default": LIST_LIMIT_DEFAULT},
}


def _after(description: str) -> dict[str, Any]:
    """A list's cursor: the id of the last item the client has."""
    return {"name": "after", "in": "query", "schema": {"type": "string"}, "description": description}


def _answer(
    description: str, schema: Any = None, media: str = JSON, headers: dict[str, bool] | None = None
) -> dict[str, Any]:
    """A response: its description, its body's schema, and its headers (name -> whether always sent)."""
    response: dict[str, Any] = {"description": description}
    if schema is not None:
        response["content"] = {media: {"schema": schema}}
    if headers:
        response["headers"] = {name: {**HEADERS[name], "required": always} for name, always in headers.items()}
    return response


def operations(ref: Ref, s: Settings) -> list[tuple[str, str, dict[str, Any]]]:
    """(Flask endpoint, method, operation) for every route of the API."""
    error, oai = ref(responses.Error), ref(responses.OpenAIError)
    job = ref(responses.Job)

    def err(status: int, description: str, openai: bool = False) -> tuple[str, dict[str, Any]]:
        headers = {"Retry-After": status == 429} if status in (429, 503) else {}
        if status == 401:
            headers = {"WWW-Authenticate": True}
        return str(status), _answer(description, oai if openai else error, headers=headers)

    def body(model: type[BaseModel]) -> dict[str, Any]:
        return {"required": True, "content": {JSON: {"schema": ref(model)}}}

    unauthorized = err(401, "unauthorized: no API key, or a wrong one (only with API keys configured)")
    oai_unauthorized = err(401, "unauthorized: no API key, or a wrong one (only with API keys configured)", True)
    not_found = err(404, "not_found: no such job, or another user's")
    unavailable = err(503, "unavailable: Redis is unreachable")
    oai_unavailable = err(503, "unavailable: Redis is unreachable", True)
    file_not_found = err(404, "not_found: no such file, or another user's", True)
    response_not_found = err(404, "not_found: no such response, or another user's", True)
    batch_not_found = err(404, "not_found: no such batch, or another user's", True)
    openai_list_errors = dict(
        [
            err(400, f"invalid_request_error: `limit` is not a whole number from 1 to {LIST_LIMIT_MAX}", True),
            oai_unauthorized,
            oai_unavailable,
        ]
    )
    forbidden = err(403, "forbidden: a request another site made, or a missing CSRF token", True)
    submit_errors = dict(
        [
            err(400, "invalid_json: not a JSON object, `NaN`, nested more than 32 levels, or not valid Unicode text"),
            unauthorized,
            err(
                403,
                "forbidden: a request another site made, a missing CSRF token (browsers), or `interactive` asked "
                "of a key that submits batch work only",
            ),
            err(404, "model_not_found: the model is not one of /v1/models"),
            err(413, f"prompt_too_large (over {s.max_prompt_chars} characters) or payload_too_large (the body)"),
            err(
                422,
                "invalid_request: wrong types, values out of range, unknown fields, neither or both of "
                "prompt/messages, an empty prompt, `max_tokens` or `ttl_s` over this server's limit, a "
                "`response_format` schema that cannot be enforced (why, and `param` names it)",
            ),
            err(429, "quota_exceeded: the caller already has as many waiting jobs as its quota allows"),
            err(
                503,
                "queue_full or model_unavailable (the model failed to load), with Retry-After; "
                "unavailable: Redis is unreachable",
            ),
        ]
    )
    openai_errors = dict(
        [
            err(
                400,
                "invalid_request_error: invalid JSON, wrong types or values out of range, fields that do not go "
                "together (`top_logprobs` without `logprobs`, `best_of` below `n` or streamed, `max_tokens` 0 "
                "without `echo`), a JSON schema that cannot be enforced (`response_format`'s, a tool's "
                "`parameters`), a field onelane does not support (`functions`, `store` true, `suffix` …), or a "
                "`logit_bias` token id beyond the model's vocabulary (found when the job runs), named in `param`",
                True,
            ),
            oai_unauthorized,
            err(403, "forbidden: a request another site made, or a missing CSRF token (browsers)", True),
            err(404, "model_not_found: the model is not one of /v1/models", True),
            err(410, "job_cancelled: the job was cancelled before it completed", True),
            err(413, "prompt_too_large or payload_too_large", True),
            err(429, "quota_exceeded", True),
            err(500, "job_failed: generation failed (the worker crashed on it, stalled, or hit its time limit)", True),
            err(
                503,
                "queue_full or model_unavailable (with Retry-After), job_expired (it waited past its TTL), "
                "or unavailable (Redis)",
                True,
            ),
        ]
    )
    links = {
        "GetJob": {"operationId": "getJob", "parameters": {"job_id": "$response.body#/id"}},
        "CancelJob": {"operationId": "cancelJob", "parameters": {"job_id": "$response.body#/id"}},
    }
    return [
        (
            "api.submit",
            "post",
            {
                "operationId": "submitJob",
                "tags": ["jobs"],
                "summary": "Submit a job",
                "description": "Admit a job into the fair queue. It then runs when its turn comes; poll it, follow its "
                "events, or cancel it. With `response_format` (`json_object`, or `json_schema` and its schema, "
                "as chat completions take it), each token is drawn under the schema's grammar: the output is "
                "JSON of it, as text.",
                "requestBody": body(SubmitJob),
                "responses": {
                    "202": {**_answer("admitted: the job, queued", job, headers={"Location": True}), "links": links},
                    **submit_errors,
                },
            },
        ),
        (
            "api.list_jobs",
            "get",
            {
                "operationId": "listJobs",
                "tags": ["jobs"],
                "summary": "List the caller's recent jobs",
                "parameters": [LIMIT],
                "responses": {
                    "200": _answer("the jobs", ref(responses.JobList)),
                    **dict(
                        [
                            err(
                                400,
                                f"invalid_request: `limit` is not one whole number from 1 to {LIST_LIMIT_MAX} (`param`: "
                                "limit); it is never clamped",
                            ),
                            unauthorized,
                            unavailable,
                        ]
                    ),
                },
            },
        ),
        (
            "api.get_job",
            "get",
            {
                "operationId": "getJob",
                "tags": ["jobs"],
                "summary": "Get a job",
                "description": "The job now. Polling a watched job counts as watching it.",
                "parameters": [JOB_ID],
                "responses": {"200": _answer("the job", job), **dict([unauthorized, not_found, unavailable])},
            },
        ),
        (
            "api.cancel_job",
            "delete",
            {
                "operationId": "cancelJob",
                "tags": ["jobs"],
                "summary": "Cancel a job",
                "description": "A queued job ends `cancelled` at once and never runs; a running one stops within one "
                "decode step, keeping its partial output. Again on a cancelled job: 200.",
                "parameters": [JOB_ID],
                "responses": {
                    "200": _answer("the job, cancelled", job),
                    **dict(
                        [
                            unauthorized,
                            err(403, "forbidden: a request another site made, or a missing CSRF token"),
                            not_found,
                            err(409, "job_ended: the job ended otherwise (completed, failed, expired)"),
                            unavailable,
                        ]
                    ),
                },
            },
        ),
        (
            "stream.job_events",
            "get",
            {
                "operationId": "jobEvents",
                "tags": ["jobs"],
                "summary": "Follow a job's events (server-sent events)",
                "description": "`queued` (position, eta_s) whenever the queue ahead moves, then `started`, `token` "
                "(text, n), `requeued` if its worker died, and exactly one terminal event "
                "(`completed`, `failed`, `cancelled` or `expired`, with the whole job); `: ping` comments "
                f"at least every {s.sse_ping_s:g} s. Each event of the job's durable log carries its index "
                "as its SSE `id`: reconnect with `Last-Event-ID` (or `?last_event_id=`) to get exactly "
                "the rest.",
                "parameters": [
                    JOB_ID,
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "schema": {"type": "string"},
                        "description": "the id of the last event the client has (an empty header counts as none)",
                    },
                    {
                        "name": "last_event_id",
                        "in": "query",
                        "schema": {"type": "string"},
                        "description": "the same, for clients that cannot set headers",
                    },
                ],
                "responses": {
                    "200": _answer("the stream: each event as `event` and its JSON `data`", _job_events(ref), SSE),
                    **dict(
                        [
                            err(
                                400,
                                "invalid_request: the id is not the index of one of this job's events "
                                "(`param` names the header or query parameter)",
                            ),
                            unauthorized,
                            not_found,
                            unavailable,
                        ]
                    ),
                },
            },
        ),
        (
            "openai.models",
            "get",
            {
                "operationId": "listModels",
                "tags": ["openai"],
                "summary": "List the served models",
                "responses": {
                    "200": _answer("the models", ref(answers.ModelList)),
                    **dict([oai_unauthorized, unavailable]),
                },
            },
        ),
        (
            "openai.chat_completions",
            "post",
            {
                "operationId": "createChatCompletion",
                "tags": ["openai"],
                "summary": "Create a chat completion",
                "description": "A job in the same queue, watched by the connection: a client that hangs up gets its job "
                "cancelled. `response_format` (`json_object`, `json_schema`) and `tools` are enforced as the "
                "answer is generated, each token drawn under their grammar: JSON of the schema, or calls "
                "(`message.tool_calls`, `finish_reason` `tool_calls`, `content` null; streamed as "
                "`delta.tool_calls`, each call's name, then its arguments in pieces) whose arguments fit their "
                "function's parameters; `tool_choice` `auto` lets the model answer in words instead. "
                + CHOICES_NOTE
                + _stream_note("chat.completion.chunk"),
                "requestBody": body(ChatRequest),
                "responses": {
                    "200": _openai_answer(ref(answers.ChatCompletion), ref(answers.ChatCompletionChunk), oai),
                    **openai_errors,
                },
            },
        ),
        (
            "openai.completions",
            "post",
            {
                "operationId": "createCompletion",
                "tags": ["openai"],
                "summary": "Create a text completion",
                "description": "As chat completions, for one prompt (`response_format` too, as in vLLM; no tools). "
                "`logprobs` N: each token's log probability and the N likeliest at its place; `echo`: the prompt "
                "comes first, with its tokens (`max_tokens` 0: the prompt scored, nothing generated); `best_of`: "
                "that many answers, the `n` of highest mean log probability per token returned. "
                + CHOICES_NOTE
                + _stream_note("text_completion"),
                "requestBody": body(CompletionRequest),
                "responses": {
                    "200": _openai_answer(ref(answers.Completion), ref(answers.CompletionChunk), oai),
                    **openai_errors,
                },
            },
        ),
        (
            "responses.create",
            "post",
            {
                "operationId": "createResponse",
                "tags": ["openai"],
                "summary": "Create a response (Responses API)",
                "description": "A job in the same queue. `background: true`: answered at once with the response, "
                "`queued`; it runs whoever follows it. Otherwise the request waits for it (and a client "
                "that hangs up has it cancelled). `previous_response_id` continues a response that ended "
                "completed or incomplete: its input and answer come before this `input`. `include` "
                '`["message.output_text.logprobs"]` (and `top_logprobs`): the output text\'s log probabilities, '
                "each text delta's with it. " + _response_stream_note(),
                "requestBody": body(ResponseRequest),
                "responses": {"200": _response_answer(ref), **openai_errors},
            },
        ),
        (
            "responses.retrieve",
            "get",
            {
                "operationId": "getResponse",
                "tags": ["openai"],
                "summary": "Get a response",
                "description": "The response now; with `stream=true`, its events from the start, or after "
                "`starting_after`. " + _response_stream_note(),
                "parameters": [
                    RESPONSE_ID,
                    {"name": "stream", "in": "query", "schema": {"type": "string", "enum": ["true", "false"]}},
                    {
                        "name": "starting_after",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 0},
                        "description": "the sequence_number of the last event the client has",
                    },
                ],
                "responses": {
                    "200": _response_answer(ref),
                    **dict(
                        [
                            err(400, "invalid_request_error: `stream` or `starting_after` malformed", True),
                            oai_unauthorized,
                            response_not_found,
                            oai_unavailable,
                        ]
                    ),
                },
            },
        ),
        (
            "responses.input_items",
            "get",
            {
                "operationId": "listResponseInputItems",
                "tags": ["openai"],
                "summary": "List a response's input items",
                "description": "The conversation the response answered: its input and, for one that continues another "
                "(`previous_response_id`), every earlier input and answer; its `instructions` apart.",
                "parameters": [
                    RESPONSE_ID,
                    LIMIT,
                    {"name": "order", "in": "query", "schema": {"type": "string", "enum": ["asc", "desc"]}},
                    _after("list those after this item, in the order asked"),
                ],
                "responses": {
                    "200": _answer("the items", ref(response_answers.InputItemList)),
                    **dict(
                        [
                            err(400, "invalid_request_error: `limit`, `order` or `after` malformed", True),
                            oai_unauthorized,
                            response_not_found,
                            oai_unavailable,
                        ]
                    ),
                },
            },
        ),
        (
            "responses.cancel",
            "post",
            {
                "operationId": "cancelResponse",
                "tags": ["openai"],
                "summary": "Cancel a background response",
                "description": "Queued: it never runs; running: it stops within a step, keeping its partial output. "
                "Again, or once it ended: the response as it is.",
                "parameters": [RESPONSE_ID],
                "responses": {
                    "200": _answer("the response", ref(response_answers.OpenAIResponse)),
                    **dict(
                        [
                            err(
                                400, "invalid_request_error: a foreground response (it ends with its own request)", True
                            ),
                            oai_unauthorized,
                            err(403, "forbidden: a request another site made, or a missing CSRF token", True),
                            response_not_found,
                            oai_unavailable,
                        ]
                    ),
                },
            },
        ),
        (
            "files.upload",
            "post",
            {
                "operationId": "createFile",
                "tags": ["openai"],
                "summary": "Upload a file (for the Batch API)",
                "description": f"multipart/form-data: `file` (UTF-8 JSONL, at most {s.max_file_bytes} bytes) and `purpose` "
                f"(`batch`); kept {s.file_retention_s} s.",
                "requestBody": {
                    "required": True,
                    "content": {
                        "multipart/form-data": {
                            "schema": {
                                "type": "object",
                                "required": ["file", "purpose"],
                                "properties": {
                                    "file": {"type": "string", "contentMediaType": "application/octet-stream"},
                                    "purpose": {"type": "string", "enum": ["batch"]},
                                },
                            }
                        }
                    },
                },
                "responses": {
                    "200": _answer("the file", ref(file_answers.FileObject)),
                    **dict(
                        [
                            err(
                                400,
                                "invalid_request_error: another purpose, no file, an empty file, or not UTF-8 text",
                                True,
                            ),
                            oai_unauthorized,
                            err(403, "forbidden: a request another site made, or a missing CSRF token", True),
                            err(413, "payload_too_large: the file is over ONELANE_MAX_FILE_BYTES", True),
                            oai_unavailable,
                        ]
                    ),
                },
            },
        ),
        (
            "files.list_files",
            "get",
            {
                "operationId": "listFiles",
                "tags": ["openai"],
                "summary": "List the caller's files",
                "description": "A page at a time: `has_more` says whether another follows, from `after` = this "
                "page's `last_id`.",
                "parameters": [
                    LIMIT,
                    {"name": "order", "in": "query", "schema": {"type": "string", "enum": ["asc", "desc"]}},
                    _after("list those after this file, in the order asked"),
                    {
                        "name": "purpose",
                        "in": "query",
                        "schema": {"type": "string"},
                        "description": "only files of this purpose (`batch`, `batch_output`)",
                    },
                ],
                "responses": {
                    "200": _answer("a page of the files", ref(file_answers.FileList)),
                    **dict(
                        [
                            err(
                                400,
                                "invalid_request_error: `limit`, `order` or `after` (not one of your files) "
                                "malformed, named in `param`",
                                True,
                            ),
                            oai_unauthorized,
                            oai_unavailable,
                        ]
                    ),
                },
            },
        ),
        (
            "files.retrieve",
            "get",
            {
                "operationId": "getFile",
                "tags": ["openai"],
                "summary": "Get a file's record",
                "parameters": [FILE_ID],
                "responses": {
                    "200": _answer("the file", ref(file_answers.FileObject)),
                    **dict([oai_unauthorized, file_not_found, oai_unavailable]),
                },
            },
        ),
        (
            "files.content",
            "get",
            {
                "operationId": "getFileContent",
                "tags": ["openai"],
                "summary": "Read a file's bytes",
                "parameters": [FILE_ID],
                "responses": {
                    "200": _answer("the file's bytes, as uploaded", {"type": "string"}, "application/octet-stream"),
                    **dict([oai_unauthorized, file_not_found, oai_unavailable]),
                },
            },
        ),
        (
            "files.delete",
            "delete",
            {
                "operationId": "deleteFile",
                "tags": ["openai"],
                "summary": "Delete a file",
                "parameters": [FILE_ID],
                "responses": {
                    "200": _answer("deleted", ref(file_answers.FileDeleted)),
                    **dict(
                        [
                            oai_unauthorized,
                            err(403, "forbidden: a request another site made, or a missing CSRF token", True),
                            file_not_found,
                            oai_unavailable,
                        ]
                    ),
                },
            },
        ),
        (
            "batches.create",
            "post",
            {
                "operationId": "createBatch",
                "tags": ["openai"],
                "summary": "Run an uploaded file's requests (Batch API)",
                "description": "Each line of the file (`purpose=batch`) is checked as its endpoint checks a request; a line "
                "that cannot run is an error line at once (with its custom_id), the others run as "
                f"batch-class jobs, at most {s.batch_waiting} waiting at once (fed as the queue drains, "
                f"outside the owner's quota). The window is {s.batch_window_s:g} s; a file with no JSON "
                "object makes a `failed` batch.",
                "requestBody": body(BatchRequest),
                "responses": {
                    "200": _answer("the batch, in_progress (or already ended)", ref(file_answers.Batch)),
                    **dict(
                        [
                            err(
                                400,
                                "invalid_request_error: an unknown endpoint or window, an input file of another purpose, "
                                f"more than {s.max_batch_lines} lines (ONELANE_MAX_BATCH_LINES), named in `param`",
                                True,
                            ),
                            oai_unauthorized,
                            forbidden,
                            err(404, "not_found: no such input file, or another user's", True),
                            oai_unavailable,
                        ]
                    ),
                },
            },
        ),
        (
            "batches.list_batches",
            "get",
            {
                "operationId": "listBatches",
                "tags": ["openai"],
                "summary": "List the caller's batches",
                "parameters": [
                    LIMIT,
                    _after("list those older than this batch"),
                ],
                "responses": {
                    "200": _answer("the batches", ref(file_answers.BatchList)),
                    **openai_list_errors,
                },
            },
        ),
        (
            "batches.retrieve",
            "get",
            {
                "operationId": "getBatch",
                "tags": ["openai"],
                "summary": "Get a batch, with its request counts",
                "parameters": [BATCH_ID],
                "responses": {
                    "200": _answer("the batch", ref(file_answers.Batch)),
                    **dict([oai_unauthorized, batch_not_found, oai_unavailable]),
                },
            },
        ),
        (
            "batches.cancel",
            "post",
            {
                "operationId": "cancelBatch",
                "tags": ["openai"],
                "summary": "Cancel a batch, keeping what completed",
                "description": "`cancelling`, then `cancelled`: what runs stops within a step, what waits never runs; "
                "each line not answered goes to the error file (`batch_cancelled`). Again, or once it "
                "ended: the batch as it is.",
                "parameters": [BATCH_ID],
                "responses": {
                    "200": _answer("the batch", ref(file_answers.Batch)),
                    **dict([oai_unauthorized, forbidden, batch_not_found, oai_unavailable]),
                },
            },
        ),
        (
            "health.healthz",
            "get",
            {
                "operationId": "healthz",
                "tags": ["health"],
                "summary": "This web process answers",
                "security": [],
                "responses": {"200": _answer("alive", ref(responses.Health))},
            },
        ),
        (
            "health.readyz",
            "get",
            {
                "operationId": "readyz",
                "tags": ["health"],
                "summary": "Ready to generate",
                "security": [],
                "description": "Redis answers, a worker holds the device with a fresh heartbeat, and its jobs make "
                "progress; each worker is listed with how many jobs it runs (never which: anyone may "
                "ask), and each model with its state.",
                "responses": {
                    "200": _answer("ready", ref(responses.Ready)),
                    "503": _answer(
                        "not ready, and why (or Redis unreachable, with Retry-After)",
                        {"oneOf": [ref(responses.NotReady), error]},
                        headers={"Retry-After": False},
                    ),
                },
            },
        ),
        (
            "health.metrics",
            "get",
            {
                "operationId": "metrics",
                "tags": ["health"],
                "summary": "Prometheus metrics",
                "security": [],
                "responses": {
                    "200": _answer("the metrics, in Prometheus' text format", {"type": "string"}, TEXT),
                    **dict([unavailable]),
                },
            },
        ),
    ]


CHOICES_NOTE = (
    "`n` answers are a job each (one prompt read for all), admitted all or none, their choices indexed from 0; one "
    "that fails fails the request, and a client that leaves cancels them all. Penalties and `logit_bias` as OpenAI "
    "defines them. "
)


def _response_stream_note() -> str:
    return (
        "With `stream=true`: `text/event-stream`, each event named by its `type`, numbered by `sequence_number` "
        "from 0 (the same numbers on every stream of one response), `: queued, position N` comments while it "
        "waits; no `[DONE]`."
    )


def _response_answer(ref: Ref) -> dict[str, Any]:
    answer = _answer(
        "the response, or (`stream`) its events",
        ref(response_answers.OpenAIResponse),
        headers={"x-onelane-job-id": False},
    )
    event = {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"type": "string"},
            "data": {
                "type": "string",
                "contentMediaType": JSON,
                "contentSchema": ref(response_answers.ResponseStreamEvent),
            },
        },
    }
    answer["content"][SSE] = {"schema": event}
    return answer


def _stream_note(obj: str) -> str:
    return (
        f'With `"stream": true`, `text/event-stream`: `data: {{chunk}}` lines (`{obj}` objects), '
        "`: queued, position N, eta_s T` comments while the "
        'job waits, a `data: {"error": …}` line if it ends without completing, then `data: [DONE]`.'
    )


def _openai_answer(whole: dict[str, Any], chunk: dict[str, Any], error: dict[str, Any]) -> dict[str, Any]:
    """200: the whole answer as JSON, or (`stream` true) its chunks, as OpenAI streams them."""
    answer = _answer(
        "the whole answer (`stream` false), or its stream",
        whole,
        headers={"x-onelane-job-id": True, "x-onelane-job-ids": False, "x-queue-time": False},
    )
    done_or_json = {
        "type": "string",
        "if": {"const": "[DONE]"},
        "else": {"contentMediaType": JSON, "contentSchema": {"anyOf": [chunk, error]}},
    }
    answer["content"][SSE] = {"schema": {"type": "object", "properties": {"data": done_or_json}, "required": ["data"]}}
    return answer


def _job_events(ref: Ref) -> dict[str, Any]:
    """The schema of one event of a job's stream (OpenAPI 3.1 has `schema` describe each event of a stream)."""

    def event(names: list[str], data: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "event": {"enum": names},
                "data": {"type": "string", "contentMediaType": JSON, "contentSchema": data},
            },
        }

    return {
        "oneOf": [
            event(["queued"], ref(responses.QueuedEvent)),
            event([EventType.STARTED.value], ref(responses.StartedEvent)),
            event([EventType.TOKEN.value], ref(responses.TokenEvent)),
            event([EventType.REQUEUED.value], ref(responses.RequeuedEvent)),
            event([kind.value for kind in EventType if kind.terminal], ref(responses.Job)),
        ]
    }
