"""Configuration, read once from the environment into a frozen, validated record."""

from __future__ import annotations

import os
import socket
import tomllib
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasks.errors import SettingsError

#: Environment variable for each setting; the README documents the same table.
ENV_NAMES: dict[str, str] = {
    "redis_url": "REDIS_URL",
    "var_dir": "ONELANE_VAR_DIR",
    "model": "ONELANE_MODEL",
    "job_ttl_s": "ONELANE_JOB_TTL",
    "result_ttl_s": "ONELANE_RESULT_TTL",
    "max_tokens_limit": "ONELANE_MAX_TOKENS_LIMIT",
    "default_max_tokens": "ONELANE_DEFAULT_MAX_TOKENS",
    "max_prompt_chars": "ONELANE_MAX_PROMPT_CHARS",
    "max_batch": "ONELANE_MAX_BATCH",
    "kv_budget_tokens": "ONELANE_KV_BUDGET",
    "prefill_step": "ONELANE_PREFILL_STEP",
    "max_queue": "ONELANE_MAX_QUEUE",
    "max_queued_per_user": "ONELANE_MAX_QUEUED_PER_USER",
    "job_time_limit_s": "ONELANE_JOB_TIME_LIMIT",
    "watch_grace_s": "ONELANE_WATCH_GRACE_S",
    "sse_ping_s": "ONELANE_SSE_PING_S",
    "device": "ONELANE_DEVICE",
    "lease_s": "ONELANE_LEASE_S",
    "max_attempts": "ONELANE_MAX_ATTEMPTS",
    "stall_s": "ONELANE_STALL_S",
    "users": "ONELANE_API_KEYS",
    "api_keys_file": "ONELANE_API_KEYS_FILE",
    "secret_key": "ONELANE_SECRET_KEY",
    "host": "ONELANE_HOST",
    "port": "ONELANE_PORT",
}


SECRETS = {"users", "secret_key"}  # never echoed in error messages
#: Variables onelane once read, with what replaced them: set, they stop the process rather than be ignored.
RETIRED = {"ONELANE_MAX_CONCURRENT": "ONELANE_MAX_BATCH (jobs generating together in one batch; 1: one at a time)"}


class User(BaseModel):
    """A user who may call the API with `key`; `max_queued` overrides the server's per-user bound."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")
    key: str = Field(min_length=1)
    max_queued: int | None = Field(None, ge=1)


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
    """A TOML file: one [users.NAME] table per user with `key` and optional `max_queued`."""
    with open(path, "rb") as f:
        table = tomllib.load(f).get("users", {})
    return [{"name": name, **entry} for name, entry in table.items()]


class Settings(BaseModel):
    """Every knob onelane has. Build with `Settings.from_env()`, or directly in tests."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    redis_url: str | None = None
    var_dir: Path = Path("var")
    model: str | None = None
    job_ttl_s: float = Field(600.0, gt=0, le=7 * 86400)
    result_ttl_s: int = Field(3600, ge=1, le=30 * 86400)
    max_tokens_limit: int = Field(4096, ge=1, le=1_000_000)
    default_max_tokens: int = Field(256, ge=1)
    max_prompt_chars: int = Field(32_000, ge=1)
    max_batch: int = Field(32, ge=1, le=256)
    kv_budget_tokens: int = Field(65_536, ge=1)
    prefill_step: int = Field(128, ge=16, le=65_536)
    max_queue: int = Field(256, ge=1, le=10_000_000)
    max_queued_per_user: int = Field(32, ge=1, le=10_000_000)
    job_time_limit_s: float = Field(900.0, gt=0)
    watch_grace_s: float = Field(10.0, gt=0, le=3600)
    sse_ping_s: float = Field(15.0, gt=0, le=15)
    device: str = Field(default_factory=socket.gethostname, min_length=1, max_length=128)
    lease_s: float = Field(3.0, ge=0.5, le=60)
    max_attempts: int = Field(2, ge=1, le=10)
    stall_s: float = Field(120.0, gt=0)
    users: tuple[User, ...] = ()
    api_keys_file: Path | None = None
    secret_key: str | None = Field(None, min_length=16)
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)

    @model_validator(mode="after")
    def _default_within_limit(self) -> Settings:
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(
                f"ONELANE_DEFAULT_MAX_TOKENS ({self.default_max_tokens}) exceeds ONELANE_MAX_TOKENS_LIMIT "
                f"({self.max_tokens_limit})"
            )
        return self

    @field_validator("users", mode="before")
    @classmethod
    def _parse_users(cls, value: object) -> object:
        return parse_api_keys(value) if isinstance(value, str) else value

    @field_validator("users")
    @classmethod
    def _unique(cls, users: tuple[User, ...]) -> tuple[User, ...]:
        for attr in ("name", "key"):
            values = [getattr(u, attr) for u in users]
            if len(set(values)) != len(values):
                raise ValueError(f"each user needs a distinct {attr}")
        return users

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read every setting from the environment; raise SettingsError naming the bad variable."""
        environ = os.environ if environ is None else environ
        retired = [f"{name} is no longer read; use {instead}" for name, instead in RETIRED.items() if name in environ]
        if retired:
            raise SettingsError("invalid configuration: " + "; ".join(retired))
        raw: dict[str, object] = {
            field: environ[name] for field, name in ENV_NAMES.items() if environ.get(name, "") != ""
        }
        try:
            if "api_keys_file" in raw:
                from_file = read_keys_file(str(raw["api_keys_file"]))
                raw["users"] = [*parse_api_keys(str(raw.get("users", ""))), *from_file]
            return cls(**raw)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"invalid configuration: ONELANE_API_KEYS_FILE: {exc}") from None
        except ValidationError as exc:
            problems = []
            for error in exc.errors():
                if not error["loc"]:  # a rule across several settings names them in its message
                    problems.append(error["msg"].removeprefix("Value error, "))
                    continue
                field = str(error["loc"][0])
                name = ENV_NAMES.get(field, field)
                shown = "<secret>" if field in SECRETS else repr(raw.get(field))
                problems.append(f"{name}={shown}: {error['msg']}")
            raise SettingsError("invalid configuration: " + "; ".join(problems)) from None

    @property
    def embedded_redis_dir(self) -> Path:
        """Where onelane's private redis-server (used when REDIS_URL is unset) keeps its data and socket."""
        return (self.var_dir / "redis").resolve()

    @property
    def effective_redis_url(self) -> str:
        from tasks.embedded_redis import EmbeddedRedis

        return self.redis_url or EmbeddedRedis(self.embedded_redis_dir).url

    @property
    def model_path(self) -> str:
        """ONELANE_MODEL, or the demo model built under var/ on first use."""
        return self.model or str((self.var_dir / "demo-model").resolve())

    @property
    def keys_required(self) -> bool:
        """With no users configured onelane runs in single-user local mode."""
        return bool(self.users)

    @property
    def model_name(self) -> str:
        """The name clients see for the served model."""
        return self.model or "onelane-demo"
