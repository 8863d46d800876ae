"""The commands that write model folders: `import-gguf` (llama.cpp's and Ollama's GGUF files) and
`make-demo-model`; worker/ does the work, imported only once one of them runs."""

from __future__ import annotations

from pathlib import Path

import click

from cli.startup import check_mlx, read_settings


@click.command("import-gguf")
@click.argument("source", type=click.Path(path_type=Path))
@click.argument("folder", type=click.Path(path_type=Path))
@click.option(
    "--dtype",
    type=click.Choice(["float32", "float16", "bfloat16"]),
    help="Write the weights dequantized, as this type (default: as the file holds them; onelane's worker "
    "can choose at load time: a model's `dtype` in the models file).",
)
def import_gguf_cmd(source: Path, folder: Path, dtype: str | None) -> None:
    """Import a GGUF file (llama.cpp's, or an Ollama blob) as a model folder mlx_lm.load reads.

    Architectures: llama, mistral, qwen2, qwen3, gemma, gemma2, phi3. Tensor types: F32, F16, BF16, Q4_0, Q4_1, Q5_0,
    Q5_1, Q8_0, Q2_K to Q6_K (so Q4_K_M, Q5_K_M, Q6_K files). Ollama's blobs are under ~/.ollama/models/blobs; `ollama
    show --modelfile NAME` names the one of a model. Then serve it: ONELANE_MODEL=FOLDER, or a [models.NAME] table
    with `path = "FOLDER"` (or `gguf = "SOURCE"` to import it on first use) in ONELANE_MODELS_FILE.
    """
    read_settings()  # for the log level
    check_mlx()
    from worker.gguf import GgufError, import_gguf

    try:
        import_gguf(source, folder, dtype)
    except GgufError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"imported {source} into {folder}: serve it with ONELANE_MODEL={folder}")


@click.command("make-demo-model")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--size", type=click.Choice(["tiny", "mini", "small"]), default="tiny")
@click.option(
    "--train",
    is_flag=True,
    help="Train the demo model that writes words (as shipped in worker/demo; minutes), not a random one.",
)
def make_demo_model_cmd(path: Path, size: str, train: bool) -> None:
    """Write a llama model that mlx_lm.load can load: random weights of --size (its output is noise), or --train."""
    settings = read_settings()  # for the log level: training reports its progress
    if train:
        from worker.blas import preload_openblas

        preload_openblas(settings)
        from worker.demo_build.train import train_demo_model

        report = train_demo_model(path)
        click.echo(f"demo model trained and written to {path}: {report}")
        return
    from worker.demo_build.model import make_demo_model

    make_demo_model(path, size=size)
    click.echo(f"demo model written to {path}")
