"""The `onelane` command (`onelane = tasks.cli:main`): up, web, worker, redis, make-demo-model, and the terminal
client's run, chat, submit, tail, jobs, cancel, batch (tasks/client_cli.py).

The one entry point of the house, and the only module of tasks/ that reaches web/ or worker/: only lazily, inside
the commands that start them (web, worker, make-demo-model), so the contract never imports the processes built on it.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import get_args

import click

from tasks import client_cli, client_url
from tasks.errors import OnelaneError
from tasks.settings import ENV_NAMES, LOG_FORMAT, LogLevel, Settings

logger = logging.getLogger("onelane")


@click.group(context_settings={"show_default": True})  # every command shows its defaults
@click.option(
    "--log-level",
    type=click.Choice(get_args(LogLevel), case_sensitive=False),
    help="Log at this level: overrides ONELANE_LOG_LEVEL (default INFO).",
)
def main(log_level: str | None) -> None:
    """onelane: a fair, observable job queue in front of one GPU running MLX."""
    # The commands that start onelane's processes read the settings and set up logging with them (_settings).


for command in (
    client_cli.run,
    client_cli.chat,
    client_cli.submit,
    client_cli.tail,
    client_cli.jobs,
    client_cli.cancel,
    client_cli.batch,
):
    main.add_command(command)


def _settings() -> Settings:
    """The settings from the environment, `--log-level` over ONELANE_LOG_LEVEL; logging is set up at their level."""
    try:
        settings = Settings.from_env()
    except OnelaneError as exc:
        raise click.ClickException(exc.message) from None
    override = click.get_current_context().find_root().params["log_level"]
    if override is not None:
        settings = settings.model_copy(update={"log_level": override})
    logging.basicConfig(level=settings.log_level, format=LOG_FORMAT)
    return settings


def _bind(command: Callable[..., None]) -> Callable[..., None]:
    """The options that say where the web listens (`up` and `web` share them)."""
    command = click.option("--port", default=None, type=int, help="Port (default ONELANE_PORT, 8000).")(command)
    return click.option("--host", default=None, help="Address to bind (default ONELANE_HOST, 127.0.0.1).")(command)


@main.command()
@_bind
def up(host: str | None, port: int | None) -> None:
    """Run everything: Redis (unless REDIS_URL is set), the worker and the web. Ctrl-C stops all.

    Refused, with nothing started, where another onelane runs: on the same port, or with its Redis in the same folder
    (ONELANE_VAR_DIR). While it runs, its web's URL is in ONELANE_VAR_DIR/web.json, where `onelane run` and the
    client's other commands find it when ONELANE_URL is not set."""
    from tasks.embedded_redis import EmbeddedRedis

    settings = _settings()
    host, port = host or settings.host, port or settings.port
    _check_port(host, port, "up")  # before anything starts: a refusal leaves all as it was
    env = {**os.environ, ENV_NAMES["log_level"]: settings.log_level}
    embedded = None
    if settings.redis_url is None:
        try:
            embedded = EmbeddedRedis(settings.embedded_redis_dir).start()
        except OnelaneError as exc:
            raise click.ClickException(exc.message) from None
        env["REDIS_URL"] = embedded.url
    web = subprocess.Popen([sys.executable, "-m", "tasks.cli", "web", "--host", host, "--port", str(port)], env=env)
    children = [subprocess.Popen([sys.executable, "-m", "tasks.cli", "worker"], env=env), web]
    record = settings.var_dir / client_url.RECORD
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        client_url.record(record, host, port)
        logger.info("onelane up: the web on %s:%s (recorded in %s for the terminal client)", host, port, record)
        while not stop.wait(0.5):
            dead = [child for child in children if child.poll() is not None]
            if dead == [web] and _port_taken(host, port):  # taken between the check and gunicorn's bind
                raise click.ClickException(f"the web could not listen: {_port_in_use(port, 'up')}; stopping everything")
            if dead:
                raise click.ClickException(f"{dead[0].args[3]} exited; stopping everything")
    finally:
        client_url.forget(record)
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:  # the worker lets its batch drain, then hands back what still runs
            try:
                child.wait(timeout=settings.drain_s + 45)
            except subprocess.TimeoutExpired:
                child.kill()
        if embedded:
            embedded.stop()
        logger.info("onelane stopped")


def _port_in_use(port: int, command: str) -> str:
    return (
        f"port {port} is in use (another onelane up?): pick another with `onelane {command} --port N` or ONELANE_PORT=N"
    )


def _check_port(host: str, port: int, command: str) -> None:
    """Refuse (ClickException) when the web could not listen on host:port, as gunicorn binds (SO_REUSEADDR: a port
    that only holds closed connections is free)."""
    try:
        _port_taken(host, port, strict=True)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise click.ClickException(_port_in_use(port, command)) from None
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def _port_taken(host: str, port: int, strict: bool = False) -> bool:
    """Whether binding host:port fails as in use; with `strict`, any failure to bind raises its OSError."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:  # (socket.gaierror is one)
        if strict:
            raise
        return exc.errno == errno.EADDRINUSE
    return False


@main.command()
@_bind
@click.option("--workers", default=1, type=click.IntRange(1, 64), help="gevent processes serving the web.")
@click.option("--connections", default=1000, type=click.IntRange(1, 100_000), help="Open connections per process.")
def web(host: str | None, port: int | None, workers: int, connections: int) -> None:
    """Serve the web front end with gunicorn: --workers gevent processes, each holding up to --connections open
    connections (a stream holds one for as long as it runs)."""
    from gevent import monkey

    monkey.patch_all()  # before redis, ssl and friends are imported, as gevent asks
    from web.server import serve

    settings = _settings()
    host, port = host or settings.host, port or settings.port
    _check_port(host, port, "web")  # at once, in words: gunicorn would retry for 5 s, then log "Can't connect"
    serve(settings, host, port, workers, connections)


def _check_mlx() -> None:
    """Stop with what to install when MLX cannot load here (in a child: the supervisor never imports MLX)."""
    probe = subprocess.run([sys.executable, "-c", "import mlx.core"], capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise click.ClickException(
            f"MLX cannot load on this machine ({last}). On Linux install one of its builds with the worker: "
            "`pip install 'onelane[cpu]'` or, with an NVIDIA GPU, `pip install 'onelane[cuda]'` "
            "(./dev.sh does it: ONELANE_MLX=cpu or cuda)."
        )


@main.command()
@click.option("--supervise/--no-supervise", default=True, help="Restart the worker when it dies or its job stalls.")
def worker(supervise: bool) -> None:
    """Run the GPU worker: dramatiq with 1 process, 1 thread, prefetch 1."""
    settings = _settings()
    _check_mlx()
    if supervise:
        from worker.supervisor import run as supervise_worker

        supervise_worker(settings)
    else:
        from worker.blas import preload_openblas

        preload_openblas()
        from worker.main import run

        run(settings)


@main.command()
def redis() -> None:
    """Run onelane's private redis-server in the foreground (what `up` does when REDIS_URL is unset)."""
    from tasks.embedded_redis import EmbeddedRedis

    settings = _settings()
    try:
        server = EmbeddedRedis(settings.embedded_redis_dir).start()
    except OnelaneError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"REDIS_URL={server.url}")
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        assert server.process is not None
        while not stop.wait(0.5) and server.process.poll() is None:
            pass
    finally:
        server.stop()  # on Ctrl-C or SIGTERM too: never leave the server behind


@main.command("import-gguf")
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
    _settings()  # for the log level
    _check_mlx()
    from worker.gguf import GgufError, import_gguf

    try:
        import_gguf(source, folder, dtype)
    except GgufError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"imported {source} into {folder}: serve it with ONELANE_MODEL={folder}")


@main.command("make-demo-model")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--size", type=click.Choice(["tiny", "mini", "small"]), default="tiny")
@click.option(
    "--train",
    is_flag=True,
    help="Train the demo model that writes words (as shipped in worker/demo; minutes), not a random one.",
)
def make_demo_model_cmd(path: Path, size: str, train: bool) -> None:
    """Write a llama model that mlx_lm.load can load: random weights of --size (its output is noise), or --train."""
    _settings()  # for the log level: training reports its progress
    if train:
        from worker.blas import preload_openblas

        preload_openblas()
        from worker.train_demo import train_demo_model

        report = train_demo_model(path)
        click.echo(f"demo model trained and written to {path}: {report}")
        return
    from worker.demo_model import make_demo_model

    make_demo_model(path, size=size)
    click.echo(f"demo model written to {path}")


if __name__ == "__main__":
    main()
