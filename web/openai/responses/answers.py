"""What the Responses API answers, as pydantic models: the response object (web/openai/responses/body.py builds
it), its input items, and its stream's events."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from web.openai.answers import TokenLogprob
from web.responses import Answer


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
