"""Configuration, read once from the environment into a frozen, validated record."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

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
    "max_concurrent": "ONELANE_MAX_CONCURRENT",
    "max_queue": "ONELANE_MAX_QUEUE",
    "max_queued_per_user": "ONELANE_MAX_QUEUED_PER_USER",
    "job_time_limit_s": "ONELANE_JOB_TIME_LIMIT",
    "watch_grace_s": "ONELANE_WATCH_GRACE_S",
    "sse_ping_s": "ONELANE_SSE_PING_S",
    "host": "ONELANE_HOST",
    "port": "ONELANE_PORT",
}


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
    max_concurrent: int = Field(1, ge=1)
    max_queue: int = Field(256, ge=1, le=10_000_000)
    max_queued_per_user: int = Field(32, ge=1, le=10_000_000)
    job_time_limit_s: float = Field(900.0, gt=0)
    watch_grace_s: float = Field(10.0, gt=0, le=3600)
    sse_ping_s: float = Field(15.0, gt=0, le=15)
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)

    @field_validator("max_concurrent")
    @classmethod
    def _one_gpu_owner(cls, value: int) -> int:
        if value != 1:
            raise ValueError("only 1 is supported: one worker owns the GPU and runs one job at a time")
        return value

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
        raw = {field: environ[name] for field, name in ENV_NAMES.items() if environ.get(name, "") != ""}
        try:
            return cls(**raw)
        except ValidationError as exc:
            problems = []
            for error in exc.errors():
                field = str(error["loc"][0]) if error["loc"] else ""
                name = ENV_NAMES.get(field, field)
                problems.append(f"{name}={raw.get(field)!r}: {error['msg']}")
            raise SettingsError("invalid configuration: " + "; ".join(problems)) from None

    @property
    def embedded_redis_socket(self) -> Path:
        """Where onelane's private redis-server listens when REDIS_URL is unset."""
        return (self.var_dir / "redis.sock").resolve()

    @property
    def effective_redis_url(self) -> str:
        return self.redis_url or f"unix://{self.embedded_redis_socket}"

    @property
    def model_path(self) -> str:
        """ONELANE_MODEL, or the demo model built under var/ on first use."""
        return self.model or str((self.var_dir / "demo-model").resolve())

    @property
    def model_name(self) -> str:
        """The name clients see for the served model."""
        return self.model or "onelane-demo"
