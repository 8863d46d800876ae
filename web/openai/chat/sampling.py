"""What chat and completions requests share: the sampling fields, `n`, `logit_bias`, service tiers, and the job
they make."""

from __future__ import annotations

import re
import reprlib
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator
from pydantic.config import JsonDict

from tasks.errors import InvalidRequest
from tasks.job import LOGIT_BIAS_MOST, JobSpec, Message, Priority, SamplingParams
from tasks.settings import Settings
from tasks.structured import Constraint, Tool
from web.openai.schemas import STRICT, TIERS
from web.requests import structure
from web.schemas import ResponseFormat, int_is_a_float, make_spec, stops_schema

CHOICES_MOST = 16  # answers one request may ask for (`n`, `best_of`): each is a job, and counts as one
TOKEN_ID = re.compile(r"0|[1-9][0-9]{0,9}")  # a token id as `logit_bias` names it: an integer, as a string
LOGIT_BIAS_SCHEMA: JsonDict = {
    "anyOf": [
        {
            "type": "object",
            "maxProperties": LOGIT_BIAS_MOST,
            "propertyNames": {"pattern": f"^({TOKEN_ID.pattern})$"},
            "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
        },
        {"type": "null"},
    ]
}


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False
    include_obfuscation: bool | None = None


class Sampling(BaseModel):
    """What both endpoints share. Defaults are OpenAI's (temperature 1)."""

    model_config = STRICT

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = Field(None, json_schema_extra=stops_schema(4))
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    service_tier: Literal["auto", "default", "flex", "priority"] | None = Field(
        None, description="`auto`/`default`: the key's class; `flex`: batch; `priority`: interactive"
    )
    ignore_eos: bool = Field(False, description="an extension, as in vLLM: generate to max_tokens past EOS")
    response_format: ResponseFormat | None = Field(
        None, description="`json_object` or `json_schema`: the answer follows it, token by token (on completions too)"
    )
    n: int | None = Field(
        None,
        ge=1,
        le=CHOICES_MOST,
        description="how many answers (`choices`, streamed interleaved with their `index`): a job each, each "
        "counted against quotas, the prompt read once for all; with a `seed`, choice 0 has it and each other one a "
        "seed derived from it (reproducible and distinct); not in a batch's line",
    )
    presence_penalty: float | None = Field(
        None, ge=-2.0, le=2.0, description="subtracted from the logit of every token the answer already holds"
    )
    frequency_penalty: float | None = Field(
        None, ge=-2.0, le=2.0, description="subtracted from a token's logit once for each time the answer holds it"
    )
    logit_bias: dict[str, float] | None = Field(
        None,
        json_schema_extra=LOGIT_BIAS_SCHEMA,
        description="token id (an integer, as a string) -> added to its logit: -100 bans it, 100 forces it; an id "
        "beyond the model's vocabulary is a 400",
    )

    _int_is_a_float = field_validator("temperature", "top_p", "presence_penalty", "frequency_penalty", mode="before")(
        int_is_a_float
    )

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _token_ids(cls, value: Any) -> Any:
        """Keys that are token ids, values -100 to 100 (either kind of JSON number), at most LOGIT_BIAS_MOST."""
        if not isinstance(value, dict):
            return value  # (the type's own error)
        if len(value) > LOGIT_BIAS_MOST:
            raise ValueError(f"logit_bias biases at most {LOGIT_BIAS_MOST} tokens")
        for key, bias in value.items():
            if not TOKEN_ID.fullmatch(key):
                raise ValueError(f"logit_bias's keys are token ids (integers, as strings), not {reprlib.repr(key)}")
            if type(bias) not in (int, float) or not -100 <= bias <= 100:
                raise ValueError(f"logit_bias's values are numbers from -100 to 100, not {reprlib.repr(bias)}")
        return {key: float(bias) for key, bias in value.items()}

    def count(self) -> int:
        """How many jobs the request is: one per answer generated."""
        return self.n or 1

    def count_field(self) -> str:
        """The field that says how many answers it asks for."""
        return "n"

    def scoring(self) -> dict[str, Any]:
        """The log probabilities its jobs record (SamplingParams' `logprobs`, `top_logprobs`, `prompt_logprobs`)."""
        return {}

    def shows_logprobs(self) -> bool:
        """Its answers show their log probabilities."""
        return False

    def check(self, batch: bool) -> None:
        """What the fields allow together; a batch's line is one job (its runner reads one answer per line)."""
        if batch and self.count() > 1:
            raise InvalidRequest("a batch's line asks for one answer: send n lines rather than n > 1", param="n")

    def structure(self) -> tuple[Constraint | None, tuple[Tool, ...]]:
        return structure([], None, None, self.response_format)

    def params(self, max_tokens: int) -> SamplingParams:
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if len(stops) > 4 or any(not s for s in stops):
            raise InvalidRequest("stop takes up to 4 non-empty strings", param="stop")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=self.seed,
            stop=tuple(stops),
            ignore_eos=self.ignore_eos,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            logit_bias={int(token): bias for token, bias in (self.logit_bias or {}).items()},
            **self.scoring(),
        )

    def priority(self) -> Priority | None:
        """The priority class the service tier asks for (None: the caller's default)."""
        return TIERS[self.service_tier] if self.service_tier else None

    def job(
        self,
        owner: str,
        settings: Settings,
        params: SamplingParams,
        prompt: str | None,
        messages: tuple[Message, ...] | None,
        batch: bool,
    ) -> tuple[JobSpec, float]:
        """The job and its TTL: watched by the request, or a batch's line (batch class, nobody watching). A request
        of several answers is that job several times over (web/openai/choices.py)."""
        priority = "batch" if batch else self.priority()
        constraint, tools = self.structure()
        return make_spec(
            owner,
            settings,
            params,
            prompt,
            messages,
            model=self.model,
            priority=priority,
            watched=not batch,
            stream=bool(self.stream) and not batch,
            line=batch,
            constraint=constraint,
            tools=tools,
        )
