"""What the chat and completions endpoints answer (and /v1/models), as pydantic models: /openapi.json documents
them, and the fuzzing in tests/test_openapi.py holds the wire formats of web/openai/chat/body.py to them."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from web.openai.answers import TokenLogprob
from web.responses import Answer


class Model(Answer):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    kind: Literal["generate", "embed", "rerank"] = Field(
        description="onelane's: what it serves: `generate` (chat and completions), `embed` (/v1/embeddings) or "
        "`rerank` (/v1/rerank), as its folder's files say (docs/models.md)"
    )
    vision: bool = Field(
        description="onelane's: whether it reads images in its prompts (a vision-language model, loaded with mlx-vlm: "
        "docs/models.md)"
    )
    batching: Literal["batched", "alone"] | None = Field(
        description="onelane's: `batched` (its jobs generate together in the batch) or `alone` (one at a time, in "
        "the same queue: an architecture whose caches mlx-lm cannot batch, or whose batched answers differ from "
        "its answers alone), as its last load found; null before it ever loaded (docs/models.md)"
    )
    images: Literal["batched", "whole", "alone"] | None = Field(
        None,
        description="onelane's, for a model that reads images: how its image prompts run, as its last load found: "
        "`batched` (beside the others), `whole` (a prompt read in one pass, as its model reads its prefix both "
        "ways: PaliGemma), `alone` (one at a time, as its images go to every step: Llama 3.2 Vision; its text "
        "prompts batch as its `batching` says); null for a text model, or before it ever loaded (docs/models.md)",
    )
    speculation: str | None = Field(
        None,
        description="onelane's: how its answers speculate, as its last load found: `prompt lookup` (each job proposes "
        "its next tokens from its own prompt and answer, and a step checks them: the answer is the same), or `off` "
        "and why (`off: its caches (MambaCache) cannot be cut a sequence at a time`; `off` when ONELANE_SPECULATE "
        "is 0); null for a model that generates nothing, or before it ever loaded (docs/performance.md)",
    )


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
