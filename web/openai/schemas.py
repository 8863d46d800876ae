"""What every OpenAI request shares: strict models, the fields let through with their neutral value (the others
onelane does not serve get a 400 by name: web/requests.py), service tiers, function definitions, metadata's bounds.

The requests themselves: web/openai/chat/schemas.py (chat and completions, on web/openai/chat/sampling.py),
web/openai/responses/schemas.py (the Responses API) and web/openai/batches/routes.py (the Batch API).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tasks.job import Priority
from tasks.structured import Tool

#: Fields onelane accepts only with their neutral value: anything else would change the answer's meaning. (`echo`
#: and `best_of` are the legacy completions'; chat lets their neutral values through, as it always did.)
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "echo": (False, None),
    "best_of": (1, None),
    "store": (False, None),
    "suffix": (None, ""),
}


#: OpenAI's service tiers as onelane's priority classes; None: the caller's own default class.
TIERS: dict[str, Priority | None] = {"auto": None, "default": None, "flex": "batch", "priority": "interactive"}

STRICT = ConfigDict(extra="forbid", strict=True)  # as OpenAI: `true` is not 1, "0.5" is not 0.5


class FunctionDefinition(BaseModel):
    model_config = STRICT

    name: str = Field(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def tool(self) -> Tool:
        if self.parameters is None:
            return Tool(name=self.name, description=self.description or "")
        return Tool(name=self.name, description=self.description or "", parameters=self.parameters)


def bounded_metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's bounds on `metadata`: 16 pairs, keys up to 64 and values up to 512 characters."""
    if value is not None and (len(value) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in value.items())):
        raise ValueError("metadata takes up to 16 pairs, keys up to 64 and values up to 512 characters")
    return value
