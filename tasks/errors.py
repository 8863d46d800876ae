"""onelane's errors: a tiny hierarchy that the web edge maps to HTTP statuses.

The first paragraph of each docstring is what the error means to a client: /openapi.json documents each route's
errors with it (web/errors.py `meaning`), so it is written for them; notes for the code come after it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.job import Job


class OnelaneError(Exception):
    """Base class for all onelane errors; `type` is the machine-readable name clients see."""

    type = "error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class SettingsError(OnelaneError):
    """A setting is missing or invalid; raised at start-up, before any client is served."""


class InvalidRequest(OnelaneError):
    """The request is malformed or names values out of range."""

    type = "invalid_request"


class InvalidParameter(InvalidRequest):
    """A header or query parameter is malformed; `param` names it.

    (The body's own fields are InvalidRequest.)
    """


class InvalidJSON(InvalidRequest):
    """The body is not a JSON object of valid text: not JSON (`NaN` is not), nested more than 32 levels, or not valid
    Unicode text."""

    type = "invalid_json"


class PreviousResponseNotFound(InvalidRequest):
    """`previous_response_id` names no response of the caller's, or one past its retention.

    (OpenAI's code, which clients act on: they resend the conversation.)
    """

    type = "previous_response_not_found"


class PromptTooLarge(InvalidRequest):
    """The prompt (or the whole body) is larger than the server accepts."""

    type = "prompt_too_large"


class ContextLengthExceeded(InvalidRequest):
    """The prompt does not fit the model: its tokens reach the model's context (no room is left for an answer) or
    pass the server's KV budget (ONELANE_KV_BUDGET). A shorter prompt may pass.

    (OpenAI's code and message; Anthropic's routes say "prompt is too long: N tokens > M maximum", `anthropic`.)
    """

    type = "context_length_exceeded"

    def __init__(self, tokens: int, context: int | None, budget: int, *, param: str | None = None) -> None:
        self.tokens, self.context, self.budget = tokens, context, budget
        if context is not None and tokens >= context and context <= budget:
            limit = f"This model's maximum context length is {context} tokens"
        else:
            limit = f"This server's KV budget (ONELANE_KV_BUDGET) is {budget} tokens"
        what = "prompt" if param == "prompt" else "messages"
        super().__init__(
            f"{limit}. However, your {what} resulted in {tokens} tokens. Please reduce the length of the {what}.",
            param=param,
        )

    @property
    def most(self) -> int:
        """The most prompt tokens the model takes: one fewer than its context (the answer needs one), and the
        budget."""
        return min(self.context - 1, self.budget) if self.context is not None else self.budget

    @property
    def anthropic(self) -> str:
        """The refusal as Anthropic words it."""
        return f"prompt is too long: {self.tokens} tokens > {self.most} maximum"

    @classmethod
    def of(cls, message: str, param: str | None = None) -> ContextLengthExceeded:
        """The refusal again from its message (a job's error, as the worker recorded it)."""
        tokens = re.search(r"resulted in (\d+) tokens", message)
        limit = re.search(r"(context length|\(ONELANE_KV_BUDGET\)) is (\d+) tokens", message)
        n = int(tokens.group(1)) if tokens else 0
        if limit is None or limit.group(1) != "context length":
            return cls(n, None, int(limit.group(2)) if limit else n, param=param)
        return cls(n, int(limit.group(2)), int(limit.group(2)), param=param)


class NotFound(OnelaneError):
    """No such thing, or not one of the caller's: the two are told apart to nobody."""

    type = "not_found"


class JobNotFound(NotFound):
    """No such job, or not one of the caller's."""


class FileNotFound(NotFound):
    """No such file, or not one of the caller's (or past its retention)."""


class BatchNotFound(NotFound):
    """No such batch, or not the caller's."""


class ModelNotFound(OnelaneError):
    """The request names a model this server does not serve (one not in /v1/models)."""

    type = "model_not_found"


class JobAlreadyEnded(OnelaneError):
    """The job already ended otherwise (completed, failed or expired): it can no longer change."""

    type = "job_ended"


class JobDidNotComplete(OnelaneError):
    """A caller waited for a job's answer, but the job ended otherwise (for the OpenAI endpoints)."""

    @staticmethod
    def of(job: Job) -> JobDidNotComplete:
        kind = {"cancelled": JobCancelled, "expired": JobExpired}.get(job.status.value, JobFailed)
        return kind(job.error.message if job.error else f"the job was {job.status.value}")


class JobCancelled(JobDidNotComplete):
    """The job was cancelled before it completed."""

    type = "job_cancelled"


class JobExpired(JobDidNotComplete):
    """The job waited past its deadline and never started."""

    type = "job_expired"


class JobFailed(JobDidNotComplete):
    """Generation failed: the worker crashed on the job, stalled, or hit its time limit."""

    type = "job_failed"


class Overloaded(OnelaneError):
    """Refused for now, the same request may succeed later: `retry_after_s` says when to try again."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueFull(Overloaded):
    """The queue holds as many waiting jobs as the server allows."""

    type = "queue_full"


class QuotaExceeded(Overloaded):
    """The caller already has as many waiting jobs as its quota allows."""

    type = "quota_exceeded"


class ModelUnavailable(Overloaded):
    """The model failed to load; it is tried again after ONELANE_MODEL_RETRY_S (`Retry-After`)."""

    type = "model_unavailable"


class Unauthorized(OnelaneError):
    """No API key (needed only with API keys configured), a wrong one, or an `Authorization` header that is not
    `Bearer <key>`."""

    type = "unauthorized"


class Forbidden(OnelaneError):
    """The request may not do this: another site's page sent it, it lacks its session's CSRF token (browsers), or it
    asks for more than its key may (`interactive` of a key that submits batch work only)."""

    type = "forbidden"


class InvalidPrompt(OnelaneError):
    """The worker cannot generate from this prompt (it is empty once tokenized); only its own job fails."""

    type = "invalid_prompt"


class LeaseLost(OnelaneError):
    """This worker no longer holds its device's lease: another worker took over, so it must stop."""

    type = "lease_lost"


class Unavailable(Overloaded):
    """Redis cannot be reached right now."""

    type = "unavailable"


class StorageFull(Overloaded):
    """Redis holds as much as ONELANE_REDIS_MEMORY allows: new work waits until older jobs and files lapse."""

    type = "storage_full"


class CheckerBusy(Overloaded):
    """Every grammar checker of the server is busy with other requests' schemas; the same request may pass later."""

    type = "checker_busy"


class ImageReaderBusy(Overloaded):
    """Every image reader of the server is busy with other requests' images; the same request may pass later."""

    type = "image_reader_busy"
