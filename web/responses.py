"""What the API answers, as pydantic models: /openapi.json documents every response with them.

A job's body is built here (`Job.of`); the other handlers build theirs with jsonify, and tests/test_openapi.py fuzzes
the app with schemathesis and checks that every answer conforms, so these models cannot drift from what is sent.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tasks import job as record
from tasks.batches import BatchRecord, Endpoint, Status
from tasks.files import FileRecord
from tasks.job import JobError, JobStatus, Priority, SamplingParams, Timings
from tasks.store import ModelState
from tasks.structured import ToolCall


class Answer(BaseModel):
    """A response body: every field is always sent, and nothing else is."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)


class TokenUsage(Answer):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = Field(description="of the prompt's tokens, those read from the worker's prefix cache")
    total_tokens: int


JOB_SPEC_FIELDS = {"model", "priority", "prompt", "messages", "params"}  # what a job's body shows of its spec


class JobMessage(Answer):
    """A message of a job's conversation as it was sent: `tool_calls` and `tool_call_id` only where it has them."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=False)

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[ToolCall] = Field(
        default_factory=list, exclude_if=lambda calls: not calls, description="an assistant's: the calls it made"
    )
    tool_call_id: str | None = Field(
        None, exclude_if=lambda value: value is None, description="a tool's: the call it answers"
    )


class Job(Answer):
    """A job: what it asked for, where it stands, and what it produced so far."""

    id: str
    object: Literal["job"]
    status: JobStatus
    model: str
    priority: Priority
    prompt: str | None = Field(description="the prompt, or null when the job was sent messages")
    messages: list[JobMessage] | None
    params: SamplingParams
    abandon_on_disconnect: bool = Field(description="skipped before generation once its client stops watching")
    position: int | None = Field(description="while queued: 1 + the number of jobs that start before it")
    eta_s: float | None = Field(
        description="while queued: seconds until it should start, forecast from what the device is doing; null "
        "while no worker holds a device"
    )
    deadline: float = Field(description="when it expires if it has not started (seconds since the epoch)")
    output: str = Field(description="the text generated so far")
    finish_reason: Literal["stop", "length", "cancelled"] | None
    error: JobError | None = Field(description="why it did not complete: expired, client_gone, worker_crashed, …")
    usage: TokenUsage
    timings: Timings
    attempts: int = Field(description="how many times a worker started it")

    @classmethod
    def of(cls, job: record.Job) -> dict[str, Any]:
        """The JSON body of `job`: the one place its shape is written."""
        spec, usage = job.spec, job.usage
        body = job.model_dump(exclude={"spec", "usage", "logprobs", "prompt_logprobs"}) | spec.model_dump(
            include=JOB_SPEC_FIELDS
        )
        tokens = TokenUsage(**usage.model_dump(), total_tokens=usage.total_tokens)
        return cls(**body, object="job", abandon_on_disconnect=spec.watched, usage=tokens).model_dump(mode="json")


class JobList(Answer):
    """The caller's recent jobs, newest first."""

    object: Literal["list"]
    data: list[Job]


class ErrorDetail(Answer):
    model_config = ConfigDict(json_schema_serialization_defaults_required=False)  # param: sent only when known

    type: str = Field(description="machine-readable: invalid_request, not_found, queue_full, …")
    message: str
    param: str | None = Field(None, description="the field, header or query parameter at fault")


class Error(Answer):
    """onelane's error body, never a stack trace."""

    error: ErrorDetail


class OpenAIErrorDetail(Answer):
    message: str
    type: str = Field(description="OpenAI's category: invalid_request_error, authentication_error, …")
    param: str | None
    code: str = Field(description="onelane's error type: invalid_request, model_not_found, job_cancelled, …")


class OpenAIError(Answer):
    """An error on the OpenAI-compatible endpoints, in OpenAI's shape."""

    error: OpenAIErrorDetail


class Model(Answer):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(Answer):
    """The served models, in the order the models file names them."""

    object: Literal["list"]
    data: list[Model]


class CalledFunction(Answer):
    name: str
    arguments: str = Field(description="the arguments as JSON text, valid for the function's parameters")


class MessageToolCall(Answer):
    """A call the answer made (`tools`): its grammar made the arguments valid for its function's parameters."""

    id: str
    type: Literal["function"]
    function: CalledFunction


class AssistantMessage(Answer):
    model_config = ConfigDict(json_schema_serialization_defaults_required=False)  # tool_calls: only with calls

    role: Literal["assistant"]
    content: str | None = Field(description="the answer's words; null when it made calls and said nothing else")
    tool_calls: list[MessageToolCall] | None = Field(
        None, min_length=1, description="the calls the answer made, sent only when it made some"
    )


class TopLogprob(Answer):
    """One of the likeliest tokens at a place."""

    token: str = Field(description="its text; `bytes:\\xe2\\x80` for bytes that are only part of a character")
    logprob: float = Field(
        description="its log probability under the sampler's distribution (after biases, penalties and a grammar's "
        "mask; before temperature and top_p); -9999.0 for a token ruled out"
    )
    bytes: list[int] = Field(description="its UTF-8 bytes")


class TokenLogprob(TopLogprob):
    """A token of the answer, and the likeliest tokens at its place."""

    top_logprobs: list[TopLogprob] = Field(description="likeliest first, as many as `top_logprobs` asked")


class ChatLogprobs(Answer):
    """The log probabilities of a choice's tokens (of a chunk's: those it carries), with `logprobs` true."""

    content: list[TokenLogprob] = Field(
        description="each token's, the answer's calls' too; in a stream, a token whose text is held back (part of a "
        "character, a call's syntax) comes with the next chunk"
    )
    refusal: None


class CompletionLogprobs(Answer):
    """The legacy completions' log probabilities (with `logprobs`), four lists side by side, one place per token: with
    `echo`, the prompt's tokens first."""

    tokens: list[str]
    token_logprobs: list[float | None] = Field(description="null: the prompt's first token, which nothing predicts")
    top_logprobs: list[dict[str, float] | None] | None = Field(
        description="the `logprobs` likeliest tokens at each place (null at the prompt's first token); null when "
        "`logprobs` is 0"
    )
    text_offset: list[int] = Field(description="where each token begins in the text returned, in characters")


class ChatChoice(Answer):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = Field(description="with `logprobs` true")
    finish_reason: Literal["stop", "length", "tool_calls"] = Field(
        description="`tool_calls`: it ended having made calls"
    )


class PromptTokensDetails(Answer):
    cached_tokens: int = Field(description="of the prompt's tokens, those read from the worker's prefix cache")


class CompletionUsage(Answer):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class ChatCompletion(Answer):
    """A whole chat answer (`stream` false)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    service_tier: Literal["default", "flex", "priority"]
    choices: list[ChatChoice]
    usage: CompletionUsage


class CompletionChoice(Answer):
    index: int
    text: str = Field(description="with `echo`, the prompt first")
    logprobs: CompletionLogprobs | None = Field(description="with `logprobs`")
    finish_reason: Literal["stop", "length"]


class Completion(Answer):
    """A whole text completion (`stream` false)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage


class Chunk(Answer):
    """A streamed piece of an answer: `usage` comes with `stream_options.include_usage` only."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=False)


class DeltaFunction(Chunk):
    name: str | None = Field(None, description="in the call's first chunk only")
    arguments: str = Field(description="the next piece of the call's arguments (JSON text); '' in its first chunk")


class DeltaToolCall(Chunk):
    """A piece of a call: its first chunk has its `id`, `type` and function's `name`; the next ones, its arguments."""

    index: int = Field(description="the call's place among the answer's calls")
    id: str | None = Field(None, description="in the call's first chunk only")
    type: Literal["function"] | None = Field(None, description="in the call's first chunk only")
    function: DeltaFunction


class Delta(Chunk):
    """What a chunk adds: words (`content`) or calls (`tool_calls`); the last chunk's is empty, beside its
    finish_reason."""

    role: Literal["assistant"] | None = Field(None, description="in the first chunk only")
    content: str | None = Field(None, description="the next piece of the answer's words")
    tool_calls: list[DeltaToolCall] | None = Field(None, min_length=1, description="the next piece of its calls")


class ChatChunkChoice(Answer):
    index: int = Field(description="the answer's (`n`): the answers' chunks come interleaved")
    delta: Delta
    logprobs: ChatLogprobs | None = Field(description="with `logprobs` true: the tokens this chunk carries")
    finish_reason: Literal["stop", "length", "tool_calls"] | None


class ChatCompletionChunk(Chunk):
    """One `data:` line of a chat stream; with `include_usage`, a last one has no choices and the usage."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    service_tier: Literal["default", "flex", "priority"]
    choices: list[ChatChunkChoice]
    usage: CompletionUsage | None = None


class CompletionChunkChoice(Answer):
    index: int = Field(description="the answer's (`n`): the answers' chunks come interleaved")
    text: str = Field(description="with `echo`, the first chunk of each answer begins with the prompt")
    logprobs: CompletionLogprobs | None = Field(description="with `logprobs`: the tokens this chunk carries")
    finish_reason: Literal["stop", "length"] | None


class CompletionChunk(Chunk):
    """One `data:` line of a text completion stream."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: CompletionUsage | None = None


class QueuedEvent(Answer):
    """`queued`: where the job stands, sent again when its place changes, when its ETA moves by more than a second and
    a tenth, and at least every 5 s while it waits (no SSE id)."""

    position: int | None
    eta_s: float | None


class StartedEvent(Answer):
    """`started`: a worker started the job, after `queued_s` seconds of waiting."""

    index: int
    queued_s: float


class TokenEvent(Answer):
    """`token`: generated text, `n` tokens of it."""

    index: int
    text: str
    n: int


class RequeuedEvent(Answer):
    """`requeued`: its worker stopped; the job is back at the front of the queue, keeping its output and the
    `completion_tokens` written so far: its next run goes on from there."""

    index: int
    attempt: int
    completion_tokens: int


class Health(Answer):
    status: Literal["ok"]


class Worker(Answer):
    """A live worker, as /readyz shows it to anyone: how many jobs it runs (`running`), never which."""

    device: str
    worker: str
    pid: int
    heartbeat_age_s: float
    running: int = Field(description="the jobs it runs now")
    progress_age_s: float | None = Field(description="while it runs jobs: since it last started one, or a token")
    batch: int = Field(description="jobs in its batch, as it last reported")
    slots: int = Field(description="the most its batch holds (its ONELANE_MAX_BATCH)")
    tokens_per_s: float
    models: list[str] = Field(description="the models it has loaded")
    active: str = Field(description="the model its batch runs ('' when the batch is empty)")
    loading: str = Field(description="the model it loads now ('' when none)")


class Ready(Answer):
    """Redis answers, a worker holds the device with a fresh heartbeat, and its jobs make progress."""

    status: Literal["ready"]
    queue_depth: int
    workers: list[Worker]
    models: list[ModelState]


class NotReady(Answer):
    """Why the server is not ready, with what the workers and models report."""

    error: ErrorDetail
    workers: list[Worker]
    models: list[ModelState]


# --- the Responses API --------------------------------------------------------------------------------------------


class OutputText(Answer):
    type: Literal["output_text"]
    text: str
    annotations: list[None] = Field(max_length=0)
    logprobs: list[TokenLogprob] = Field(description="with `include` message.output_text.logprobs; else empty")


class OutputMessage(Answer):
    """The assistant's message: the response's output item, unless the answer made calls (`tools`)."""

    id: str
    type: Literal["message"]
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"]
    content: list[OutputText]


class FunctionCall(Answer):
    """A call the answer made (`tools`), an output item of its own: its grammar made the arguments valid for its
    function's parameters. A `function_call_output` item with its `call_id` gives the model the call's result."""

    id: str = Field(description="`fc_…_N`: the response's rest and the call's place among its calls")
    type: Literal["function_call"]
    status: Literal["in_progress", "completed", "incomplete"]
    call_id: str
    name: str
    arguments: str = Field(description="the arguments as JSON text")


class InputText(Answer):
    type: Literal["input_text"]
    text: str


class InputItem(Answer):
    """One message of the conversation a response answered: the assistant's as output text."""

    id: str = Field(description="`msg_…_N`: the response's rest and the message's place in its input")
    type: Literal["message"]
    role: Literal["system", "user", "assistant"]
    status: Literal["completed"]
    content: list[InputText | OutputText] = Field(min_length=1, max_length=1)


class FunctionCallItem(Answer):
    """A call an assistant's message of the conversation made."""

    id: str = Field(description="`fc_…_N_K`: the message's place in the input, the call's among its calls")
    type: Literal["function_call"]
    status: Literal["completed"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(Answer):
    """A call's result, as the conversation gave it to the model."""

    id: str = Field(description="`fco_…_N`: the response's rest and the item's place in its input")
    type: Literal["function_call_output"]
    status: Literal["completed"]
    call_id: str
    output: str


class InputItemList(Answer):
    """A page of a response's input items, newest first unless `order=asc`."""

    object: Literal["list"]
    data: list[InputItem | FunctionCallItem | FunctionCallOutputItem]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ResponseError(Answer):
    code: str = Field(description="why it failed: expired, worker_crashed, model_unavailable, …")
    message: str


class IncompleteDetails(Answer):
    reason: Literal["max_output_tokens"]


class InputTokensDetails(Answer):
    cached_tokens: int = Field(description="of the input's tokens, those read from the worker's prefix cache")


class OutputTokensDetails(Answer):
    reasoning_tokens: int


class ResponseUsage(Answer):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class Echoed(Answer):
    """Echoed as the request gave it: what it left out is not sent."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=False)


class TextFormatAnswer(Answer):
    type: Literal["text", "json_object"]


class JsonSchemaFormatAnswer(Echoed):
    type: Literal["json_schema"]
    name: str
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextAnswer(Answer):
    format: TextFormatAnswer | JsonSchemaFormatAnswer = Field(description="`text.format`, as the request gave it")


class FunctionToolAnswer(Answer):
    type: Literal["function"]
    name: str
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool | None


class FunctionChoiceAnswer(Answer):
    type: Literal["function"]
    name: str


class OpenAIResponse(Answer):
    """A response (OpenAI's Responses API): a view of its job. `expired` shows as `failed` (error code `expired`);
    a job that stopped at its token limit as `incomplete`."""

    id: str = Field(description="`resp_…`: the job `job_…` with the same rest")
    object: Literal["response"]
    created_at: int
    status: Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
    background: bool
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int
    metadata: dict[str, str]
    model: str
    output: list[OutputMessage | FunctionCall] = Field(
        description="the assistant's message, or (`tools`) the calls it made, one item each"
    )
    parallel_tool_calls: bool
    previous_response_id: str | None = Field(description="the response this one continues")
    service_tier: Literal["default", "flex", "priority"]
    store: bool
    temperature: float
    text: TextAnswer
    tool_choice: Literal["none", "auto", "required"] | FunctionChoiceAnswer
    tools: list[FunctionToolAnswer]
    top_logprobs: int
    top_p: float
    truncation: Literal["disabled"]
    usage: ResponseUsage | None = Field(description="once it ended")
    user: None


class ResponseStreamEvent(Answer):
    """One event of a response's stream (its SSE `event` is its `type`): the fields beyond `type` and
    `sequence_number` are those of OpenAI's event of that type."""

    model_config = ConfigDict(extra="allow")

    type: Literal[
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
        "response.incomplete",
        "response.failed",
        "error",
    ]
    sequence_number: int = Field(description="from 0, the same on every stream of one response")


# --- the Files API ------------------------------------------------------------------------------------------------


class FileObject(Answer):
    """An uploaded file (kept ONELANE_FILE_RETENTION)."""

    id: str = Field(description="`file-…`")
    object: Literal["file"]
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: Literal["batch", "batch_output"] = Field(
        description="`batch`: uploaded; `batch_output`: a batch's results"
    )
    status: Literal["processed"]
    status_details: None

    @classmethod
    def of(cls, file: FileRecord) -> dict[str, Any]:
        """The JSON body of `file`."""
        fields = file.model_dump(exclude={"owner"})
        return cls(**fields, object="file", status="processed", status_details=None).model_dump(mode="json")


class FileList(Answer):
    """A page of the caller's files, newest first unless `order=asc`."""

    object: Literal["list"]
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(Answer):
    id: str
    object: Literal["file"]
    deleted: Literal[True]


class BatchCounts(Answer):
    total: int = Field(description="every line of the input file")
    completed: int = Field(description="lines answered: the output file's")
    failed: int = Field(description="lines without an answer: the error file's")


class BatchError(Answer):
    code: str
    message: str
    param: str | None
    line: int | None


class BatchErrors(Answer):
    object: Literal["list"]
    data: list[BatchError]


class Batch(Answer):
    """A batch (OpenAI's Batch API): an uploaded file's requests run as batch-class jobs."""

    id: str = Field(description="`batch_…`")
    object: Literal["batch"]
    endpoint: Endpoint
    errors: BatchErrors | None = Field(description="why a `failed` batch ran nothing")
    input_file_id: str
    completion_window: Literal["24h"]
    status: Status
    output_file_id: str | None = Field(description="its answered lines, once it ended (none: null)")
    error_file_id: str | None = Field(description="its lines without an answer, once it ended (none: null)")
    created_at: int
    in_progress_at: int | None
    expires_at: int
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: BatchCounts
    metadata: dict[str, str] | None

    @classmethod
    def of(cls, batch: BatchRecord) -> dict[str, Any]:
        """The JSON body of `batch`."""
        fields = batch.model_dump(exclude={"owner", "total", "completed", "failed", "errors", "output_keep_s"})
        errors = {"object": "list", "data": batch.errors} if batch.errors else None
        counts = BatchCounts(total=batch.total, completed=batch.completed, failed=batch.failed)
        return cls(**fields, object="batch", errors=errors, request_counts=counts).model_dump(mode="json")


class BatchList(Answer):
    """The caller's batches, newest first."""

    object: Literal["list"]
    data: list[Batch]
    first_id: str | None
    last_id: str | None
    has_more: bool
