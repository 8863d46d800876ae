"""Configuration, read once from the environment into a frozen, validated record. The models it may serve are
described in tasks/catalogue.py, the users who may call it in tasks/users.py."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasks.catalogue import (
    MODEL_NAME_CHARS,
    ModelConfig,
    demo_model_path,
    is_model_name,
    read_models_file,
    unconfigured,
)
from tasks.errors import SettingsError
from tasks.users import User, parse_api_keys, read_keys_file

#: Environment variable for each setting; the README documents the same table.
ENV_NAMES: dict[str, str] = {
    "redis_url": "REDIS_URL",
    "var_dir": "ONELANE_VAR_DIR",
    "model": "ONELANE_MODEL",
    "models_file": "ONELANE_MODELS_FILE",
    "models_memory": "ONELANE_MODELS_MEMORY",
    "model_switch_wait_s": "ONELANE_MODEL_SWITCH_WAIT_S",
    "model_retry_s": "ONELANE_MODEL_RETRY_S",
    "batch_cost": "ONELANE_BATCH_COST",
    "fair_prompt_weight": "ONELANE_FAIR_PROMPT_WEIGHT",
    "fair_output_weight": "ONELANE_FAIR_OUTPUT_WEIGHT",
    "job_ttl_s": "ONELANE_JOB_TTL",
    "result_ttl_s": "ONELANE_RESULT_TTL",
    "max_tokens_limit": "ONELANE_MAX_TOKENS_LIMIT",
    "default_max_tokens": "ONELANE_DEFAULT_MAX_TOKENS",
    "max_prompt_chars": "ONELANE_MAX_PROMPT_CHARS",
    "image_max_bytes": "ONELANE_IMAGE_MAX_BYTES",
    "image_max_pixels": "ONELANE_IMAGE_MAX_PIXELS",
    "max_images": "ONELANE_MAX_IMAGES",
    "image_hosts": "ONELANE_IMAGE_HOSTS",
    "image_private_hosts": "ONELANE_IMAGE_PRIVATE_HOSTS",
    "image_fetch_s": "ONELANE_IMAGE_FETCH_S",
    "image_keep_s": "ONELANE_IMAGE_KEEP",
    "image_user_bytes": "ONELANE_IMAGE_USER_BYTES",
    "image_total_bytes": "ONELANE_IMAGE_TOTAL_BYTES",
    "redis_memory_bytes": "ONELANE_REDIS_MEMORY",
    "max_batch": "ONELANE_MAX_BATCH",
    "kv_budget_tokens": "ONELANE_KV_BUDGET",
    "prefill_step": "ONELANE_PREFILL_STEP",
    "decode_floor": "ONELANE_DECODE_FLOOR",
    "preempt_limit": "ONELANE_PREEMPT_LIMIT",
    "max_queue": "ONELANE_MAX_QUEUE",
    "max_queued_per_user": "ONELANE_MAX_QUEUED_PER_USER",
    "job_time_limit_s": "ONELANE_JOB_TIME_LIMIT",
    "watch_grace_s": "ONELANE_WATCH_GRACE_S",
    "sse_ping_s": "ONELANE_SSE_PING_S",
    "device": "ONELANE_DEVICE",
    "lease_s": "ONELANE_LEASE_S",
    "lease_hung_s": "ONELANE_LEASE_HUNG_S",
    "max_attempts": "ONELANE_MAX_ATTEMPTS",
    "stall_s": "ONELANE_STALL_S",
    "drain_s": "ONELANE_DRAIN_S",
    "redis_timeout_s": "ONELANE_REDIS_TIMEOUT_S",
    "users": "ONELANE_API_KEYS",
    "api_keys_file": "ONELANE_API_KEYS_FILE",
    "secret_key": "ONELANE_SECRET_KEY",
    "host": "ONELANE_HOST",
    "port": "ONELANE_PORT",
    "log_level": "ONELANE_LOG_LEVEL",
    "openblas": "ONELANE_OPENBLAS",
    "gemv": "ONELANE_GEMV",
    "gemv_threads": "ONELANE_GEMV_THREADS",
    "prefix_cache_bytes": "ONELANE_PREFIX_CACHE",
    "prefix_cache_disk_bytes": "ONELANE_PREFIX_CACHE_DISK",
    "prefix_cache_disk_owner_bytes": "ONELANE_PREFIX_CACHE_DISK_OWNER",
    "prefix_cache_dir": "ONELANE_PREFIX_CACHE_DIR",
    "prefix_cache_shared": "ONELANE_PREFIX_CACHE_SHARED",
    "cache_affinity_s": "ONELANE_CACHE_AFFINITY_S",
    "file_retention_s": "ONELANE_FILE_RETENTION",
    "max_file_bytes": "ONELANE_MAX_FILE_BYTES",
    "max_batch_lines": "ONELANE_MAX_BATCH_LINES",
    "batch_waiting": "ONELANE_BATCH_WAITING",
    "batch_share": "ONELANE_BATCH_SHARE",
    "batch_window_s": "ONELANE_BATCH_WINDOW",
    "fast_forward": "ONELANE_FAST_FORWARD",
    "speculate": "ONELANE_SPECULATE",
    "speculate_budget": "ONELANE_SPECULATE_BUDGET",
    "speculate_always": "ONELANE_SPECULATE_ALWAYS",
}


PREFILL_BATCH = 8  # prompts the worker prefills together in one step (each by at most ONELANE_PREFILL_STEP tokens)
SECRETS = {"users", "secret_key"}  # never echoed in error messages
#: Variables onelane once read, with what replaced them: set, they stop the process rather than be ignored.
RETIRED = {"ONELANE_MAX_CONCURRENT": "ONELANE_MAX_BATCH (jobs generating together in one batch; 1: one at a time)"}


LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
LOG_FORMAT = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"  # every onelane process's log lines


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}


def physical_memory() -> int:
    """This machine's RAM in bytes (on Apple silicon, the memory the GPU shares)."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def parse_bytes(value: object) -> int:
    """`8GiB`, `500MB`, `123456` or `50%` (of this machine's RAM) -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(%|[a-zA-Z]*)\s*", str(value))
    if not match or match[2].lower() not in {*_UNITS, "%"}:
        raise ValueError("expected bytes, with a unit (500MB, 8GiB) or as a share of RAM (50%)")
    number, unit = float(match[1]), match[2].lower()
    if unit == "%":
        if not 0 < number <= 100:
            raise ValueError("a share of RAM is between 0% and 100%")
        return int(physical_memory() * number / 100)
    return int(number * _UNITS[unit])


class Settings(BaseModel):
    """Every knob onelane has. Build with `Settings.from_env()`, or directly in tests. Every number is finite and
    bounded (the README's Settings table gives each range): what Redis's EXPIRE, the Lua scripts and a sleep take."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    redis_url: str | None = None
    var_dir: Path = Path("var")
    model: str | None = None
    models_file: Path | None = None
    models: tuple[ModelConfig, ...] = ()
    models_memory: int = Field(default_factory=lambda: physical_memory() // 2, ge=1, le=2**50)
    model_switch_wait_s: float = Field(10.0, ge=0, le=3600)
    model_retry_s: float = Field(60.0, gt=0, le=86400)
    batch_cost: int = Field(10, ge=1, le=1000)
    # the fair order charges a flow what its jobs cost the device, in token units: a prompt token read (not from a
    # prefix cache) at this weight, a generated token at the next: "auto" is what one cost the device against a
    # prompt token, at a full batch, as the model's workers measured it last, read as a job is charged (4 until they
    # have: docs/operating.md)
    fair_prompt_weight: float = Field(1.0, ge=0.001, le=1000)
    fair_output_weight: Annotated[float, Field(ge=0.001, le=1000)] | Literal["auto"] = "auto"
    job_ttl_s: float = Field(600.0, gt=0, le=7 * 86400)
    result_ttl_s: int = Field(3600, ge=1, le=30 * 86400)
    max_tokens_limit: int = Field(4096, ge=1, le=1_000_000)
    default_max_tokens: int = Field(256, ge=1, le=1_000_000)
    max_prompt_chars: int = Field(200_000, ge=1, le=10_000_000)
    # images in a prompt (tasks/images.py), for a model that reads them: each image's bytes and pixels, and how many
    # one request holds (a request's body may grow by their base64 text, for a server that serves such a model)
    image_max_bytes: int = Field(8 * 2**20, ge=1024, le=64 * 2**20)
    image_max_pixels: int = Field(4096 * 4096, ge=64, le=100_000_000)
    max_images: int = Field(4, ge=1, le=64)
    # the hosts whose http(s) image URLs the web may fetch (comma-separated names; ".example.com": any below it);
    # none by default: an image comes inline, and a server that fetches any URL a client names is an SSRF hole
    image_hosts: tuple[str, ...] = ()
    # whether a listed host may resolve to a private address (loopback, private, link-local: an operator's own image
    # server); off, only public addresses are fetched from, whatever the name
    image_private_hosts: bool = False
    image_fetch_s: float = Field(10.0, ge=0.5, le=120)  # one image URL's whole fetch, at most
    # the image bytes Redis keeps (tasks/store/images.py): each image while a job holding it may wait and run, and
    # after a job that holds it completes, this long more for a follow-up (0: not at all), within its result TTL;
    # at most ..._USER_BYTES of them a user's, ..._TOTAL_BYTES in all
    image_keep_s: int = Field(900, ge=0, le=30 * 86400)
    image_user_bytes: int = Field(128 * 2**20, ge=1024, le=2**40)
    image_total_bytes: int = Field(1024 * 2**20, ge=1024, le=2**44)
    # what Redis may hold before new work (jobs, files, batches) is refused with 503 (tasks/store/memory.py): above
    # the images' own bound, with room for the jobs' records and files
    redis_memory_bytes: int = Field(4 * 2**30, ge=16 * 2**20, le=2**46)
    max_batch: int = Field(32, ge=1, le=256)
    kv_budget_tokens: int = Field(65_536, ge=1, le=100_000_000)
    prefill_step: int = Field(128, ge=16, le=65_536)
    # the tokens per second every generating job keeps while prompts are read beside it: a step that reads prompts
    # takes at most 1 / this (their chunks shrink to fit, to 16 tokens each at least); 0: no floor (chunks of
    # ONELANE_PREFILL_STEP, whatever the others wait)
    decode_floor: float = Field(4.0, ge=0, le=1000)
    # how many times a batch-class job may be set aside for interactive work that finds no slot free (0: never)
    preempt_limit: int = Field(2, ge=0, le=100)
    max_queue: int = Field(256, ge=1, le=10_000_000)
    max_queued_per_user: int = Field(32, ge=1, le=10_000_000)
    job_time_limit_s: float = Field(900.0, gt=0, le=7 * 86400)  # + result_ttl_s: a running job's EXPIRE
    watch_grace_s: float = Field(10.0, gt=0, le=3600)
    sse_ping_s: float = Field(15.0, gt=0, le=15)
    device: str = Field(default_factory=socket.gethostname, min_length=1, max_length=128)
    lease_s: float = Field(3.0, ge=0.5, le=60)
    # a worker whose interpreter has not run its heartbeat for this long is hung: its keeper lets the lease lapse
    lease_hung_s: float = Field(60.0, ge=1, le=3600)
    max_attempts: int = Field(2, ge=1, le=10)
    stall_s: float = Field(120.0, gt=0, le=86400)
    # a worker stopped in good order lets its batch run this long to end, then hands back what still runs
    drain_s: float = Field(5.0, ge=0, le=3600)
    # how long a Redis call may take before it counts as failed (connect, read, write); blocking reads excepted
    redis_timeout_s: float = Field(5.0, ge=0.1, le=300)
    users: tuple[User, ...] = ()
    api_keys_file: Path | None = None
    secret_key: str | None = Field(None, min_length=16)
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    log_level: LogLevel = "INFO"  # of every onelane process; `onelane --log-level` overrides it
    openblas: bool = True  # a Linux worker preloads OpenBLAS when installed (worker/blas/); false: MLX's own BLAS
    # with OpenBLAS preloaded, every float product goes to the kernel of worker/blas/shim.c (built with the system's C
    # compiler on first start); false: to OpenBLAS's matrix product
    gemv: bool = True
    # the threads the shim's kernel shares each product between: 2, the worker's thread and one helper (a decode step
    # on both cores); 1, the worker's thread alone (a worker beside other busy work on a small machine: the helper
    # would mostly wait awake for its share)
    gemv_threads: int = Field(2, ge=1, le=2)
    # the worker's prefix cache (worker/prefix_cache.py): KV states kept for prompts that start the same way; 0: off
    prefix_cache_bytes: int = Field(default_factory=lambda: physical_memory() // 10, ge=0, le=2**50)
    # its disk tier (worker/prefix_disk.py): every entry also written to a folder as it is made, read back after a
    # crash or by another worker sharing the folder; at most this many bytes of files (0: none), and at most
    # ..._OWNER of them a user's (or, shared, everyone's); the least recently used go first
    prefix_cache_disk_bytes: int = Field(8 * 2**30, ge=0, le=2**50)
    prefix_cache_disk_owner_bytes: int = Field(2 * 2**30, ge=1, le=2**50)
    prefix_cache_dir: Path | None = None  # its folder (None: ONELANE_VAR_DIR/prefix-cache), may be shared by hosts
    file_retention_s: int = Field(7 * 86400, ge=60, le=30 * 86400)  # an uploaded file (/v1/files) is kept this long
    max_file_bytes: int = Field(32 * 2**20, ge=1024, le=512 * 2**20)  # the largest file /v1/files takes
    max_batch_lines: int = Field(50_000, ge=1, le=1_000_000)  # the most requests one batch's input file holds
    # a batch's lines waiting in the queue at once: it feeds the queue as it drains (places of its owner's quota)
    batch_waiting: int = Field(8, ge=1, le=10_000)
    # the share of the live workers' slots that batches' lines may hold at once (waiting or running): the rest stay
    # free for everyone else's work, so an interactive job finds a slot without waiting for a batch's line to end
    batch_share: float = Field(0.75, gt=0, le=1)
    # what a batch's completion_window "24h" gives it, in seconds (shorter for tests or a busy server)
    batch_window_s: float = Field(86400.0, ge=1, le=7 * 86400)
    prefix_cache_shared: bool = False  # reuse an entry across owners (else only its owner's later jobs hit it)
    # a follow-up turn waits at most this long for the device whose prefix cache holds its history (with room)
    cache_affinity_s: float = Field(2.0, ge=0, le=60)
    # an answer under a grammar reads this many tokens or more that the grammar forces (a schema's fixed keys) in one
    # prefill, rather than drawing them one step each; 0: never
    fast_forward: int = Field(4, ge=0, le=4096)
    # a decoding job proposes up to this many tokens a step from its own prompt and answer, checked in the step's one
    # forward pass (worker/batch/speculation.py; the answer is the same either way); 0: never. A step that checks
    # proposals reads at most ..._BUDGET tokens over all its jobs (the batch backs off as it fills)
    speculate: int = Field(8, ge=0, le=64)
    speculate_budget: int = Field(64, ge=2, le=4096)
    # propose even where the batch measures that it gives fewer tokens/s (to measure what proposals keep)
    speculate_always: bool = False

    @field_validator("image_hosts", mode="before")
    @classmethod
    def _hosts(cls, value: object) -> object:
        if isinstance(value, str):
            value = [h.strip().lower() for h in value.split(",") if h.strip()]
        if isinstance(value, list | tuple):
            bad = [h for h in value if not re.fullmatch(r"\.?[a-z0-9]([a-z0-9.-]*[a-z0-9])?", str(h))]
            if bad:
                raise ValueError(f"not a host name: {bad[0]!r} (names, comma-separated; '.example.com' for any below)")
        return value

    @model_validator(mode="after")
    def _default_within_limit(self) -> Settings:
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(
                f"ONELANE_DEFAULT_MAX_TOKENS ({self.default_max_tokens}) exceeds ONELANE_MAX_TOKENS_LIMIT "
                f"({self.max_tokens_limit})"
            )
        if not self.image_max_bytes <= self.image_user_bytes <= self.image_total_bytes:
            raise ValueError(
                f"images: ONELANE_IMAGE_MAX_BYTES ({self.image_max_bytes}) ≤ ONELANE_IMAGE_USER_BYTES "
                f"({self.image_user_bytes}) ≤ ONELANE_IMAGE_TOTAL_BYTES ({self.image_total_bytes}), or no image fits"
            )
        if self.lease_hung_s < self.lease_s:
            raise ValueError(
                f"ONELANE_LEASE_HUNG_S ({self.lease_hung_s}) must be at least ONELANE_LEASE_S ({self.lease_s}): a "
                "worker is not hung before its lease could lapse"
            )
        if self.image_total_bytes >= self.redis_memory_bytes:
            raise ValueError(
                f"ONELANE_IMAGE_TOTAL_BYTES ({self.image_total_bytes}) must be below ONELANE_REDIS_MEMORY "
                f"({self.redis_memory_bytes}), which bounds everything Redis holds, the images with the rest"
            )
        return self

    @model_validator(mode="after")
    def _one_way_to_name_models(self) -> Settings:
        if self.model and self.models:
            raise ValueError("set ONELANE_MODEL (one model) or ONELANE_MODELS_FILE (several), not both")
        if self.model and not is_model_name(self.model):
            raise ValueError(
                "ONELANE_MODEL is served under its own name: it may not hold a comma or a control "
                f"character, nor be longer than {MODEL_NAME_CHARS} characters"
            )
        if self.models:
            names = [m.name for m in self.models]
            if len(set(names)) != len(names):
                raise ValueError("ONELANE_MODELS_FILE: each model needs a distinct name")
            defaults = [m.name for m in self.models if m.default]
            if len(defaults) > 1:
                raise ValueError(f"ONELANE_MODELS_FILE: only one model may be the default, not {', '.join(defaults)}")
        return self

    @field_validator(
        "models_memory",
        "prefix_cache_bytes",
        "prefix_cache_disk_bytes",
        "prefix_cache_disk_owner_bytes",
        "max_file_bytes",
        "image_user_bytes",
        "image_total_bytes",
        "redis_memory_bytes",
        mode="before",
    )
    @classmethod
    def _bytes(cls, value: object) -> object:
        return parse_bytes(value)

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

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_in_any_case(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

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
        for field, read in (("api_keys_file", read_keys_file), ("models_file", read_models_file)):
            if field not in raw:
                continue
            try:
                entries = read(str(raw[field]))
            except (OSError, ValueError) as exc:  # tomllib.TOMLDecodeError is a ValueError
                raise SettingsError(f"invalid configuration: {ENV_NAMES[field]}: {exc}") from None
            if field == "api_keys_file":
                raw["users"] = [*parse_api_keys(str(raw.get("users", ""))), *entries]
            else:
                raw["models"] = entries
        try:
            return cls(**raw)
        except ValidationError as exc:
            problems = []
            for error in exc.errors():
                if not error["loc"]:  # a rule across several settings names them in its message
                    problems.append(error["msg"].removeprefix("Value error, "))
                    continue
                field = str(error["loc"][0])
                name = ENV_NAMES.get(field, field)
                if field in ("models", "users") and len(error["loc"]) > 1:  # an entry of a file: name it
                    entry = raw[field][error["loc"][1]]  # type: ignore[index]  # (a list of entries, loc[1] an index)
                    where = ".".join(str(part) for part in error["loc"][2:])
                    file = ENV_NAMES["models_file" if field == "models" else "api_keys_file"]
                    problems.append(
                        f"{file}: {field}.{entry.get('name')}{'.' + where if where else ''}: {error['msg']}"
                    )
                    continue
                shown = "<secret>" if field in SECRETS else repr(raw.get(field))
                problems.append(f"{name}={shown}: {error['msg']}")
            raise SettingsError("invalid configuration: " + "; ".join(problems)) from None

    @property
    def prefix_cache_folder(self) -> Path:
        """Where the prefix cache's disk tier keeps its files."""
        return self.prefix_cache_dir or self.var_dir / "prefix-cache"

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
        """ONELANE_MODEL, or the shipped demo model, or (when its folder is missing) a random one built under var/.
        (With no model configured, the default model is another: see `catalog`.)"""
        return self.model or demo_model_path(self.var_dir)

    @property
    def keys_required(self) -> bool:
        """With no users configured onelane runs in single-user local mode."""
        return bool(self.users)

    @property
    def catalog(self) -> tuple[ModelConfig, ...]:
        """The models served: the models file's, or the one ONELANE_MODEL names, or, when neither is set, the default
        model and the demo model (catalogue.unconfigured)."""
        if self.models:
            return self.models
        if self.model:
            return (ModelConfig(name=self.model, path=self.model),)
        return unconfigured(self.var_dir)

    @property
    def model_name(self) -> str:
        """The default model's name: the one marked `default`, else the first."""
        catalog = self.catalog
        return next((m.name for m in catalog if m.default), catalog[0].name)

    def model_named(self, name: str) -> ModelConfig | None:
        return next((m for m in self.catalog if m.name == name), None)

    def model_key(self, name: str) -> str:
        """The prefix cache's name for a served model as it is loaded (its load options included)."""
        config = self.model_named(name)
        return config.cache_key() if config is not None else name

    def prefix_key(self, model: str, owner: str) -> tuple[str, str]:
        """The prefix cache's key of a job's entries, the one place it is built: its model as loaded, and whose
        entries it may read (its owner's, or everyone's, '', when shared)."""
        return self.model_key(model), "" if self.prefix_cache_shared else owner

    def user_named(self, name: str) -> User | None:
        return next((u for u in self.users if u.name == name), None)
