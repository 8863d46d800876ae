"""The users who may call the API: their keys, their bounds, and what a job costs their turns."""

from __future__ import annotations

import tomllib

from pydantic import BaseModel, ConfigDict, Field

from tasks.job import Priority


class User(BaseModel):
    """A user who may call the API with `key`; `max_queued` overrides the server's per-user bound, `weight` is their
    share of the device against other users (2: twice the turns), `priority` the class their jobs get by default;
    an `admin` sees every user's jobs on the queue dashboard and may cancel any of them."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")
    key: str = Field(min_length=1)
    max_queued: int | None = Field(None, ge=1, le=10_000_000)
    weight: int = Field(1, ge=1, le=100)
    priority: Priority = "interactive"
    admin: bool = Field(False, strict=True)  # a TOML boolean: `admin = true`


def parse_api_keys(value: str) -> list[dict[str, str]]:
    """`alice:k1,bob:k2` -> users."""
    users = []
    for pair in filter(None, (p.strip() for p in value.split(","))):
        name, sep, key = pair.partition(":")
        if not sep:
            raise ValueError(f"expected user:key pairs separated by commas, got {pair!r}")
        users.append({"name": name.strip(), "key": key.strip()})
    return users


def read_keys_file(path: str) -> list[dict[str, object]]:
    """A TOML file: one [users.NAME] table per user with `key` and optional `max_queued`, `weight`, `priority`,
    `admin`."""
    with open(path, "rb") as f:
        table = tomllib.load(f).get("users", {})
    return [{"name": name, **entry} for name, entry in table.items()]


def turn_share(user: User | None, priority: Priority, batch_cost: int) -> float:
    """What a token of a job's costs its owner's flow, against one of an interactive job of a user of weight 1: a
    batch job's `batch_cost` times, shared by the owner's weight (an owner not configured, as in local mode, weighs
    1). The tokens are priced by the fair order (tasks/lua/common.lua estimate_units and charge_used)."""
    return (batch_cost if priority == "batch" else 1) / (user.weight if user else 1)
