"""The commands that run onelane's processes: `up` (all of them), `web`, `worker` and `redis`.

web/ and worker/ are imported only inside the commands that start them: `onelane web` lets gevent patch the standard
library first, and the supervisor of `onelane worker` never imports MLX.
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
from typing import cast

import click

from cli import url
from cli.startup import check_mlx, read_settings
from tasks.errors import OnelaneError
from tasks.quiet_start import start_service
from tasks.settings import ENV_NAMES
from tasks.stop_signals import stop_on_signals

logger = logging.getLogger("onelane")


def _onelane(*args: str) -> list[str]:
    """The command line of an `onelane ARGS` child (args[3] is its command's name)."""
    return [sys.executable, "-m", "cli.main", *args]


def _bind(command: Callable[..., None]) -> Callable[..., None]:
    """The options that say where the web listens (`up` and `web` share them)."""
    command = click.option("--port", default=None, type=int, help="Port (default ONELANE_PORT, 8000).")(command)
    return click.option("--host", default=None, help="Address to bind (default ONELANE_HOST, 127.0.0.1).")(command)


@click.command()
@_bind
def up(host: str | None, port: int | None) -> None:
    """Run everything: Redis (unless REDIS_URL is set), the worker and the web. Ctrl-C stops all.

    Refused, with nothing started, where another onelane runs: on the same port, or with its Redis in the same folder
    (ONELANE_VAR_DIR). While it runs, its web's URL is in ONELANE_VAR_DIR/web.json (yours alone: 0600), where
    `onelane run` and the client's other commands find it when ONELANE_URL is not set."""
    from tasks.embedded_redis import EmbeddedRedis  # (redis: `onelane web` imports it only once gevent patched)

    settings = read_settings()
    host, port = host or settings.host, port or settings.port
    _check_port(host, port, "up")  # before anything starts: a refusal leaves all as it was
    env = {**os.environ, ENV_NAMES["log_level"]: settings.log_level}
    # From here on a Ctrl-C or SIGTERM stops what has started, in good order: Redis runs in a session of its own (the
    # terminal's Ctrl-C does not reach it), so an interrupt while it starts must not leave it behind.
    stop = threading.Event()
    stop_on_signals(stop)
    embedded = None
    children: list[subprocess.Popen[bytes]] = []
    record = settings.var_dir / url.RECORD
    try:
        if settings.redis_url is None:
            try:
                embedded = EmbeddedRedis(settings.embedded_redis_dir).start()
            except OnelaneError as exc:
                raise click.ClickException(exc.message) from None
            env["REDIS_URL"] = embedded.url
        if stop.is_set():
            return
        web = start_service(_onelane("web", "--host", host, "--port", str(port)), env=env)
        children = [start_service(_onelane("worker"), env=env), web]
        url.record(record, host, port)
        logger.info("onelane up: the web on %s:%s (recorded in %s for the terminal client)", host, port, record)
        while not stop.wait(0.5):
            dead = [child for child in children if child.poll() is not None]
            if dead == [web] and _port_taken(host, port):  # taken between the check and gunicorn's bind
                raise click.ClickException(f"the web could not listen: {_port_in_use(port, 'up')}; stopping everything")
            if dead:
                name = cast(list[str], dead[0].args)[3]  # (Popen types its args as any command; these are _onelane's)
                raise click.ClickException(f"{name} exited; stopping everything")
    finally:
        url.forget(record)
        _stop_all(children, settings.drain_s)
        if embedded:
            embedded.stop()
        logger.info("onelane stopped")


def _stop_all(children: list[subprocess.Popen[bytes]], drain_s: float) -> None:
    """Stop the web and the worker: SIGTERM to each still running, then each waited for, as long as the worker's
    drain takes and 45 s more; one still running then is killed."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:  # the worker lets its batch drain, then hands back what still runs
        try:
            child.wait(timeout=drain_s + 45)
        except subprocess.TimeoutExpired:
            child.kill()


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


@click.command()
@_bind
@click.option("--workers", default=1, type=click.IntRange(1, 64), help="gevent processes serving the web.")
@click.option("--connections", default=1000, type=click.IntRange(1, 100_000), help="Open connections per process.")
def web(host: str | None, port: int | None, workers: int, connections: int) -> None:
    """Serve the web front end with gunicorn: --workers gevent processes, each holding up to --connections open
    connections (a stream holds one for as long as it runs)."""
    from tasks.quiet_start import exit_quietly_on_stop  # (os and signal only: nothing gevent must patch first)

    exit_quietly_on_stop()  # a Ctrl-C before gunicorn sets its handlers ends it quietly
    from gevent import monkey

    monkey.patch_all()  # before redis, ssl and friends are imported, as gevent asks
    from web.server import serve

    settings = read_settings()
    host, port = host or settings.host, port or settings.port
    _check_port(host, port, "web")  # at once, in words: gunicorn would retry for 5 s, then log "Can't connect"
    serve(settings, host, port, workers, connections)


@click.command()
@click.option("--supervise/--no-supervise", default=True, help="Restart the worker when it dies or its job stalls.")
def worker(supervise: bool) -> None:
    """Run the GPU worker: dramatiq with 1 process, 1 thread, prefetch 1."""
    from tasks.quiet_start import exit_quietly_on_stop

    exit_quietly_on_stop()  # a Ctrl-C during the slow imports below (worker.main's, check_mlx's) ends it quietly
    settings = read_settings()
    check_mlx()
    if supervise:
        from worker.supervisor import run as supervise_worker

        supervise_worker(settings)
    else:
        from worker.blas import preload_openblas

        preload_openblas(settings)
        from worker.main import run

        run(settings)


@click.command()
def redis() -> None:
    """Run onelane's private redis-server in the foreground (what `up` does when REDIS_URL is unset)."""
    from tasks.embedded_redis import EmbeddedRedis

    settings = read_settings()
    try:
        server = EmbeddedRedis(settings.embedded_redis_dir).start()
    except OnelaneError as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"REDIS_URL={server.url}")
    stop = threading.Event()
    stop_on_signals(stop)
    try:
        assert server.process is not None
        while not stop.wait(0.5) and server.process.poll() is None:
            pass
    finally:
        server.stop()  # on Ctrl-C or SIGTERM too: never leave the server behind
