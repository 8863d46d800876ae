"""The one record that the web, the store and the worker exchange about a job."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: A job's class: "batch" runs when no interactive work waits, or at a small guaranteed share (ONELANE_BATCH_COST).
Priority = Literal["interactive", "batch"]
LOGIT_BIAS_MOST = 300  # tokens a request may bias (OpenAI's bound)
TOP_LOGPROBS_MOST = 20  # alternatives a token's log probability may list (OpenAI's bound)


class JobStatus(str, Enum):
    """OpenAI's background-response vocabulary, plus `expired`."""

    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def ended(self) -> bool:
        return self not in (JobStatus.QUEUED, JobStatus.IN_PROGRESS)


class Tool(BaseModel):
    """A function the model may call, as the request defined it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolCall(BaseModel):
    """A call the model made: `arguments` is JSON text, as OpenAI's wire format has it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    name: str
    arguments: str


class Constraint(BaseModel):
    """The grammar a job's answer follows, and what the web makes of the answer: JSON text, or tool calls (with
    text instead, under `tool_choice` auto)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["json", "tools"]
    grammar: str


NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"  # a message's `name`, as OpenAI's API checks it


class Picture(BaseModel):
    """An image in a message (tasks/images.py): its digest, where it sits in the message's text (before the
    character at `at`), and, once read at the door, its format and size. Its bytes travel with it to admission,
    which keeps them in Redis under the digest; they are never part of the job's record."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    at: int = Field(0, ge=0)
    mime: str | None = None
    width: int | None = None
    height: int | None = None
    data: bytes | None = Field(None, exclude=True, repr=False)
    url: str | None = Field(None, exclude=True)  # an http(s) URL to fetch at the door, if its host is allowed


class Message(BaseModel):
    """One chat message: an assistant's may hold the tool calls it made; a tool's answers one of them. `name`
    tells participants of one role apart (tasks/chat_prompt.py shows it to the model)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = Field(None, pattern=NAME_PATTERN)
    images: tuple[Picture, ...] = ()  # in the order they come in the message

    def parts(self) -> list[tuple[str, str]]:
        """Its text and its images in order: ("text", words) and ("image", digest)."""
        out: list[tuple[str, str]] = []
        at = 0
        for p in sorted(self.images, key=lambda p: p.at):
            if p.at > at:
                out.append(("text", self.content[at : p.at]))
            out.append(("image", p.digest))
            at = max(at, p.at)
        if at < len(self.content) or not out:
            out.append(("text", self.content[at:]))
        return out


def history_digest(cache_key: tuple[str, str], messages: Iterable[Message]) -> str:
    """A conversation's history, named under the prefix cache's key of its entries (Settings.prefix_key): by the
    worker, for the history a completed chat leaves in its prefix cache (its messages, then its answer), which
    finish.lua records against its device; and by a follow-up's admission (its messages but the last), to be
    steered there. The one way both name it."""
    parts = [
        *cache_key,
        *(f"{m.role}\n{m.content}" + "".join(f"\n{p.digest}@{p.at}" for p in m.images) for m in messages),
    ]
    return hashlib.sha1("".join(f"{part}{HISTORY_SEP}" for part in parts).encode()).hexdigest()


HISTORY_SEP = "\x1e"  # between the parts a history digest is made of


class SamplingParams(BaseModel):
    """What a request may choose about generation; load options belong to the server.

    Penalties and biases as OpenAI defines them, over the tokens generated (not the prompt's): `presence_penalty` is
    subtracted from a token's logit once it has appeared, `frequency_penalty` times the number of times it has;
    `logit_bias` is added to its token's logit. Log probabilities are of the distribution the sampler draws from:
    the model's, after the biases, penalties and a grammar's mask, before temperature and top_p (as mlx-lm's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(256, ge=0)  # 0: only with prompt_logprobs (a text scored, nothing generated)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=1_000_000)  # draw among the k likeliest tokens only (0: all)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[int, float] = Field(default_factory=dict, max_length=LOGIT_BIAS_MOST)
    logprobs: bool = False  # each generated token's log probability is recorded
    top_logprobs: int = Field(0, ge=0, le=TOP_LOGPROBS_MOST)  # ... and that many of the likeliest tokens' at its place
    prompt_logprobs: bool = False  # each prompt token's log probability is recorded (echo), before any generation

    @model_validator(mode="after")
    def _consistent(self) -> SamplingParams:
        if self.max_tokens == 0 and not self.prompt_logprobs:
            raise ValueError("max_tokens may be 0 only to score the prompt (its log probabilities)")
        if any(not -100 <= v <= 100 or t < 0 for t, v in self.logit_bias.items()):
            raise ValueError("logit_bias maps token ids to values from -100 to 100")
        return self

    @property
    def penalized(self) -> bool:
        """Its logits are changed before sampling, by penalties or biases."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)


class Choice(BaseModel):
    """One of `of` answers a request asked for (OpenAI's `n`, or `best_of`): each is a job, and the worker reads
    their common prompt once for all of them (the group's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    group: str  # the first job's id: the same for every job of the request
    index: int = Field(ge=0)
    of: int = Field(ge=2)


class ResponseFields(BaseModel):
    """What a job made through OpenAI's Responses API (/v1/responses) echoes back beyond the job: the worker never
    reads it (the instructions are also the first of the job's messages)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    background: bool = False
    instructions: str | None = None
    metadata: dict[str, str] = {}
    service_tier: str = "default"
    previous_response_id: str | None = None  # the response it continues (its messages begin with that conversation)
    # `text`, `tools`, `tool_choice`, `parallel_tool_calls` as the request gave them (those it left out: not kept),
    # echoed back; the job's `constraint` and `tools` are what enforce them
    echo: dict[str, Any] = {}


class Pooled(BaseModel):
    """What an embedding or rerank job reads, in one forward pass of its model, instead of generating: nothing is
    sampled, and its answer (tasks/pooled.py) is one vector per input, or one score per document."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["embed", "rerank"]
    # embed: the inputs, each a text or its token ids; rerank: the documents, scored against `query`
    texts: tuple[str | tuple[int, ...], ...] = Field(min_length=1)
    query: str | None = None
    dimensions: int | None = Field(None, ge=1)  # embed: the first this many of each vector, normalized again
    encoding: Literal["float", "base64"] = "float"  # embed: how its answer gives the vectors (OpenAI's encoding_format)


class JobSpec(BaseModel):
    """The immutable part of a job, fixed at admission."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    owner: str
    model: str
    prompt: str | None = None
    messages: tuple[Message, ...] | None = None
    params: SamplingParams = SamplingParams()
    priority: Priority = "interactive"
    # True: the job is skipped before generation once its client stops watching (stream or polling).
    watched: bool = False
    # True: its client reads the answer as it is generated (a stream), so its tokens are written the moment they
    # come; a job nobody follows live (a plain request, a batch's line) has them written in quiet windows
    # (worker/output.py), unless a stream opens on it later (Store.follow_live)
    stream: bool = False
    # set for a job made through /v1/responses (it is then also readable as a response)
    response: ResponseFields | None = None
    # what the answer must be (a JSON schema, any JSON object, tool calls): enforced while it is generated
    constraint: Constraint | None = None
    # the functions the model is told it may call (rendered into its prompt)
    tools: tuple[Tool, ...] = ()
    # one of several answers to one request (OpenAI's `n`): None for a request of one
    choice: Choice | None = None
    # an embedding or rerank job's inputs (no prompt nor messages then): read beside the batch, nothing generated
    pooled: Pooled | None = None
    # a count of its prompt's tokens only (Anthropic's count_tokens): read by the worker beside the batch, nothing
    # generated; its usage's prompt_tokens is the count
    count: bool = False
    # its prompt's tokens as the web counted them at admission (tasks/token_count.py; None: not counted there)
    prompt_tokens: int | None = Field(None, ge=0)

    @property
    def side(self) -> bool:
        """Whether it is read beside the batch, taking no slot of it (a pooled job, a count)."""
        return self.pooled is not None or self.count

    @property
    def new_tokens(self) -> int:
        """The most tokens it may generate (none for a job read beside the batch)."""
        return 0 if self.side else self.params.max_tokens


class JobError(BaseModel):
    model_config = ConfigDict(frozen=True)

    type: str
    message: str
    param: str | None = None  # the request's field at fault, when the worker found the request invalid


class Usage(BaseModel):
    model_config = ConfigDict(frozen=True)

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of the prompt's: read from the worker's prefix cache instead of prefilled

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Timings(BaseModel):
    """When it happened (seconds since the epoch, all read from Redis's clock), and how its tokens came: those its
    steps checked as proposed (speculation, worker/batch/speculation.py) and kept, in its last run."""

    model_config = ConfigDict(frozen=True)

    queued_at: float
    started_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    proposed_tokens: int = 0
    accepted_tokens: int = 0


class Job(BaseModel):
    """A job as stored in Redis: its spec plus everything that happened to it."""

    model_config = ConfigDict(frozen=True)

    id: str
    spec: JobSpec
    status: JobStatus
    deadline: float
    timings: Timings
    attempts: int = 0
    preemptions: int = 0  # the times it was set aside for interactive work (a batch-class job)
    output: str = ""
    finish_reason: Literal["stop", "length", "cancelled"] | None = None
    stop_sequence: str | None = None  # the stop string it ended at, if it did (finish_reason `stop`)
    error: JobError | None = None
    usage: Usage = Usage()
    position: int | None = None
    eta_s: float | None = None
    logprobs: str = ""  # each generated token's entry, if it asked for them (tasks/logprobs.py reads them)
    prompt_logprobs: str = ""  # its prompt tokens' entries, if it asked for them (echo)

    @property
    def owner(self) -> str:
        return self.spec.owner

    @classmethod
    def from_redis(cls, job_id: str, fields: dict[str, str], output: str, logprobs: str = "") -> Job:
        """Assemble a job from its Redis hash (see tasks/store/jobs.py for the layout) and its output text."""

        def num(name: str) -> float | None:
            value = fields.get(name)
            return float(value) if value not in (None, "") else None

        error = fields.get("error")
        return cls(
            id=job_id,
            spec=JobSpec.model_validate_json(fields["spec"]),
            status=JobStatus(fields["status"]),
            deadline=float(fields["deadline"]),
            timings=Timings(
                queued_at=float(fields["queued_at"]),
                started_at=num("started_at"),
                first_token_at=num("first_token_at"),
                finished_at=num("finished_at"),
                proposed_tokens=int(fields.get("proposed_tokens", 0)),
                accepted_tokens=int(fields.get("accepted_tokens", 0)),
            ),
            attempts=int(fields.get("attempts", 0)),
            preemptions=int(fields.get("preemptions", 0)),
            output=output,
            logprobs=logprobs,
            prompt_logprobs=fields.get("prompt_logprobs", ""),
            finish_reason=fields.get("finish_reason") or None,
            stop_sequence=fields.get("stop_sequence") or None,
            error=JobError.model_validate_json(error) if error else None,
            usage=Usage(
                prompt_tokens=int(fields.get("prompt_tokens", 0)),
                completion_tokens=int(fields.get("completion_tokens", 0)),
                cached_tokens=int(fields.get("cached_tokens", 0)),
            ),
        )


def new_job_id() -> str:
    """An unguessable id: 128 random bits."""
    return "job_" + secrets.token_urlsafe(16)


def error_json(type_: str, message: str, param: str | None = None) -> str:
    return json.dumps({"type": type_, "message": message, **({"param": param} if param else {})})
