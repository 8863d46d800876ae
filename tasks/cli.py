"""The `onelane` command: up, web, worker, redis, make-demo-model."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import click

from tasks.errors import OnelaneError
from tasks.settings import Settings

logger = logging.getLogger("onelane")


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except OnelaneError as exc:
        raise click.ClickException(exc.message) from None


@click.group()
@click.option("--log-level", default="INFO", show_default=True, envvar="ONELANE_LOG_LEVEL")
def main(log_level: str) -> None:
    """onelane: a fair, observable job queue in front of one GPU running MLX."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"
    )


@main.command()
@click.option("--host", default=None, help="Address to bind (default ONELANE_HOST, 127.0.0.1).")
@click.option("--port", default=None, type=int, help="Port (default ONELANE_PORT, 8000).")
def up(host: str | None, port: int | None) -> None:
    """Run everything: Redis (unless REDIS_URL is set), the worker and the web. Ctrl-C stops all."""
    from tasks.embedded_redis import EmbeddedRedis

    settings = _settings()
    env = dict(os.environ)
    embedded = None
    if settings.redis_url is None:
        try:
            embedded = EmbeddedRedis(settings.embedded_redis_dir).start()
        except OnelaneError as exc:
            raise click.ClickException(exc.message) from None
        env["REDIS_URL"] = embedded.url
    web_args = [*(["--host", host] if host else []), *(["--port", str(port)] if port else [])]
    children = [
        subprocess.Popen([sys.executable, "-m", "tasks.cli", "worker"], env=env),
        subprocess.Popen([sys.executable, "-m", "tasks.cli", "web", *web_args], env=env),
    ]
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            dead = [child.args for child in children if child.poll() is not None]
            if dead:
                raise click.ClickException(f"{dead[0][-1]} exited; stopping everything")
    finally:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
        if embedded:
            embedded.stop()
        logger.info("onelane stopped")


@main.command()
@click.option("--host", default=None, help="Address to bind (default ONELANE_HOST, 127.0.0.1).")
@click.option("--port", default=None, type=int, help="Port (default ONELANE_PORT, 8000).")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="gunicorn worker processes (gevent: each holds many open streams).")  # fmt: skip
@click.option("--connections", default=1000, show_default=True, type=click.IntRange(1, 100_000),
              help="Open connections per worker process.")  # fmt: skip
def web(host: str | None, port: int | None, workers: int, connections: int) -> None:
    """Serve the web front end with gunicorn (gevent workers)."""
    from gevent import monkey

    monkey.patch_all()  # before redis, ssl and friends are imported, as gevent asks
    from web.server import serve

    settings = _settings()
    serve(settings, host or settings.host, port or settings.port, workers, connections)


@main.command()
@click.option("--supervise/--no-supervise", default=True, show_default=True,
              help="Restart the worker process when it dies or its job stalls.")  # fmt: skip
def worker(supervise: bool) -> None:
    """Run the GPU worker: dramatiq with 1 process, 1 thread, prefetch 1."""
    settings = _settings()
    if supervise:
        from worker.supervisor import run as supervise_worker

        supervise_worker(settings)
    else:
        from worker.blas import worker_env

        env = worker_env(dict(os.environ))
        if env.get("LD_PRELOAD") != os.environ.get("LD_PRELOAD"):  # it only takes effect from the start
            os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)  # the same command, again
        from worker.main import run

        run(settings)


@main.command()
def redis() -> None:
    """Run onelane's private redis-server in the foreground (what `up` does when REDIS_URL is unset)."""
    from tasks.embedded_redis import EmbeddedRedis

    settings = _settings()
    server = EmbeddedRedis(settings.embedded_redis_dir).start()
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


@main.command("make-demo-model")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--size", type=click.Choice(["tiny", "mini", "small"]), default="tiny", show_default=True)
def make_demo_model_cmd(path: Path, size: str) -> None:
    """Write a tiny random-weight llama model (its output is noise) that mlx_lm.load can load."""
    from worker.demo_model import make_demo_model

    make_demo_model(path, size=size)
    click.echo(f"demo model written to {path}")


if __name__ == "__main__":
    main()
