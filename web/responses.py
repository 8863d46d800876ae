"""What the API answers, as pydantic models: /openapi.json documents every response with them. The OpenAI
endpoints' answers are in web/openai/chat/answers.py, responses/answers.py and batches/answers.py, on the same
`Answer`.

A job's body is built here (`Job.of`); the other handlers build theirs with jsonify, and tests/test_openapi.py fuzzes
the app with schemathesis and checks that every answer conforms, so these models cannot drift from what is sent.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tasks import job as record
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


class JobImage(Answer):
    """An image a message held: its SHA-256, where it sat in the message's text, its format and size. (Its bytes are
    not kept with the job.)"""

    digest: str
    at: int
    mime: str | None
    width: int | None
    height: int | None


class JobMessage(Answer):
    """A message of a job's conversation as it was sent: `tool_calls`, `tool_call_id` and `name` only where it has
    them."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=False)

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[ToolCall] = Field(
        default_factory=list, exclude_if=lambda calls: not calls, description="an assistant's: the calls it made"
    )
    tool_call_id: str | None = Field(
        None, exclude_if=lambda value: value is None, description="a tool's: the call it answers"
    )
    name: str | None = Field(
        None, exclude_if=lambda value: value is None, description="the participant's name, where it was given"
    )
    images: list[JobImage] = Field(
        default_factory=list, exclude_if=lambda images: not images, description="a user's: the images it held"
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
    stop_sequence: str | None = Field(None, description="the stop string it ended at, if it ended at one")
    error: JobError | None = Field(description="why it did not complete: expired, client_gone, worker_crashed, …")
    usage: TokenUsage
    timings: Timings
    attempts: int = Field(description="how many times a worker started it")
    preemptions: int = Field(description="how many times it was set aside for interactive work (batch class)")

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


class AnthropicErrorDetail(Answer):
    type: str = Field(description="Anthropic's: invalid_request_error, authentication_error, overloaded_error, …")
    message: str


class AnthropicError(Answer):
    """An error on the Messages API, in Anthropic's shape."""

    type: Literal["error"]
    error: AnthropicErrorDetail


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
    """`requeued`: its run ended before the job did; the job is back in the queue, keeping its output and the
    `completion_tokens` written so far: its next run goes on from there."""

    index: int
    attempt: int
    completion_tokens: int
    reason: str = Field(
        description="worker_crashed, generation_error (its batch's step failed), stopping (its worker stopped in good "
        "order) or preempted (a batch-class job set aside for interactive work; not counted as an attempt)"
    )


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
    """Redis answers, a worker holds the device with a fresh heartbeat, its jobs make progress, and the default
    model neither loads nor failed to load."""

    status: Literal["ready"]
    queue_depth: int
    workers: list[Worker]
    models: list[ModelState]


class NotReady(Answer):
    """Why the server is not ready, with what the workers and models report."""

    error: ErrorDetail
    model: str | None = Field(None, description="the default model, when it is the reason: it loads, or cannot load")
    workers: list[Worker]
    models: list[ModelState]
