"""A response's input: the items a request sends (messages, the calls an earlier answer made, their outputs), and
the conversation a response answered, which one that continues it begins with."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag

from tasks.errors import InvalidRequest
from tasks.images import assemble
from tasks.job import Job, Message
from tasks.structured import ToolCall, call_id, read_calls
from web.openai.schemas import STRICT


class InputContent(BaseModel):
    """A part of an input message's content: the caller's text, or an earlier answer's sent back."""

    model_config = STRICT

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # an earlier answer's output_text, sent back as it came
    logprobs: list[Any] | None = None


class InputImage(BaseModel):
    """An image in a user's input message, for a model that reads images (tasks/images.py bounds it)."""

    model_config = STRICT

    type: Literal["input_image"]
    image_url: str | None = Field(
        None,
        description="a data: URL (data:image/png;base64,…), or an http(s) URL, which the server fetches only from the "
        "hosts its operator lists (ONELANE_IMAGE_HOSTS; none by default, and any other is refused)",
    )
    file_id: str | None = None  # (refused: an image is sent inline)
    detail: Literal["auto", "low", "high"] | None = None


class InputMessage(BaseModel):
    """One message of a response's `input` (an "easy input message", or an item of type `message`)."""

    model_config = STRICT

    type: Literal["message"] | None = None
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[InputContent | InputImage]
    id: str | None = None  # an earlier output item's, sent back as it came
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def to_message(self) -> Message:
        parts = [("text", self.content)] if isinstance(self.content, str) else [_part(p) for p in self.content]
        content, images = assemble(parts, "input")
        if images and self.role != "user":
            raise InvalidRequest("only a user's message may hold images", param="input")
        return Message(role="system" if self.role == "developer" else self.role, content=content, images=images)


def _part(part: InputContent | InputImage) -> tuple[str, str]:
    if isinstance(part, InputContent):
        return ("text", part.text)
    if part.image_url is None:
        raise InvalidRequest(
            "an input_image is sent inline, as image_url (a data: URL); file_id is not read", param="input"
        )
    return ("image", part.image_url)


class FunctionCallInput(BaseModel):
    """A call an earlier answer made (an output item of type `function_call`), sent back in `input`."""

    model_config = STRICT

    type: Literal["function_call"]
    call_id: str = Field(max_length=256)
    name: str
    arguments: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def call(self) -> ToolCall:
        return ToolCall(id=self.call_id, name=self.name, arguments=self.arguments)


class FunctionCallOutput(BaseModel):
    """What the caller's function returned for the call `call_id`: the model reads it as the tool's answer."""

    model_config = STRICT

    type: Literal["function_call_output"]
    call_id: str = Field(max_length=256)
    output: str | list[InputContent]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def to_message(self) -> Message:
        content = self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)
        return Message(role="tool", content=content, tool_call_id=self.call_id)


def _item_type(value: Any) -> str:
    """An input item's type; an "easy input message" has none."""
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) else "message"


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[FunctionCallInput, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")],
    Discriminator(_item_type),
]


def turns_of(items: list[InputItem]) -> list[Message]:
    """Input items as the conversation's messages: calls in a row are one assistant message's tool_calls."""
    turns: list[Message] = []
    for item in items:
        if not isinstance(item, FunctionCallInput):
            turns.append(item.to_message())
        elif turns and turns[-1].role == "assistant":
            turns[-1] = turns[-1].model_copy(update={"tool_calls": (*turns[-1].tool_calls, item.call())})
        else:
            turns.append(Message(role="assistant", content="", tool_calls=(item.call(),)))
    return turns


def input_of(job: Job) -> tuple[Message, ...]:
    """A response's input, as the conversation it answers: its messages without its instructions (the system
    message they became; OpenAI keeps them apart, and carries them no further)."""
    messages = job.spec.messages or ()
    if job.spec.response is not None and job.spec.response.instructions:
        return messages[1:]
    return messages


def answer_of(job: Job) -> Message:
    """A response's answer as the assistant's message: its words, and the calls it made (under `tools`)."""
    words, calls = read_calls(job.output, job.spec.constraint)
    made = tuple(ToolCall(id=call_id(job.id, i), name=name, arguments=args) for i, (name, args) in enumerate(calls))
    return Message(role="assistant", content=words, tool_calls=made)


def conversation_of(job: Job) -> tuple[Message, ...]:
    """What a response that continues `job`'s begins with: its input, then its answer."""
    return (*input_of(job), answer_of(job))
