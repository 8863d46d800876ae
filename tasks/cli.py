"""The `onelane` command: up, web, worker, redis, make-demo-model; run, submit, jobs, cancel, tail (a client)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from tasks.errors import OnelaneError
from tasks.settings import Settings

if TYPE_CHECKING:  # the client's imports wait until a client command runs: `web` must patch ssl with gevent first
    from rich.console import Console
    from rich.live import Live

    from tasks.client import Client

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


def _preload_openblas() -> None:
    """Run this same command again with OpenBLAS preloaded, when worker/blas.py finds it and it is not yet."""
    from worker.blas import worker_env

    env = worker_env(dict(os.environ))
    if env.get("LD_PRELOAD") != os.environ.get("LD_PRELOAD"):  # it only takes effect from the start
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)  # the same command, again


@main.command()
@click.option("--supervise/--no-supervise", default=True, show_default=True,
              help="Restart the worker process when it dies or its job stalls.")  # fmt: skip
def worker(supervise: bool) -> None:
    """Run the GPU worker: dramatiq with 1 process, 1 thread, prefetch 1."""
    settings = _settings()
    _check_mlx()
    if supervise:
        from worker.supervisor import run as supervise_worker

        supervise_worker(settings)
    else:
        _preload_openblas()
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
@click.option("--train", is_flag=True,
              help="Train the demo model that writes words (as shipped in worker/demo; minutes), not a random one.")
def make_demo_model_cmd(path: Path, size: str, train: bool) -> None:
    """Write a llama model that mlx_lm.load can load: random weights of --size (its output is noise), or --train."""
    if train:
        _preload_openblas()
        from worker.train_demo import train_demo_model

        report = train_demo_model(path)
        click.echo(f"demo model trained and written to {path}: {report}")
        return
    from worker.demo_model import make_demo_model

    make_demo_model(path, size=size)
    click.echo(f"demo model written to {path}")


# The terminal client: run, submit, jobs, cancel and tail talk to a running web over HTTP (tasks/client.py), at
# ONELANE_URL with ONELANE_API_KEY. A job's tokens go to stdout, so it pipes; its standing and errors go to stderr.

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports after a Ctrl-C
STATUS_STYLES = {"completed": "green", "failed": "red", "expired": "red", "cancelled": "yellow", "in_progress": "cyan"}


def _client() -> tuple[Client, Console]:
    from rich.console import Console

    from tasks.client import Client

    return Client.from_env(), Console(stderr=True, highlight=False)


@contextmanager
def _reported() -> Iterator[None]:
    """The client's errors as one line on stderr and exit status 1 (with the wait an overloaded server asks)."""
    from tasks.client import ApiError, ClientError

    try:
        yield
    except ApiError as exc:
        wait = f"; retry after {exc.retry_after_s:g} s" if exc.retry_after_s is not None else ""
        raise click.ClickException(f"{exc}{wait}") from None
    except ClientError as exc:
        raise click.ClickException(str(exc)) from None


class _Status:
    """One transient status line on stderr: a spinner on a terminal; elsewhere each new text once, as a line."""

    def __init__(self, console: Console) -> None:
        self.console, self.shown = console, ""
        self.live: Live | None = None

    def show(self, text: str) -> None:
        from rich.live import Live
        from rich.spinner import Spinner
        from rich.text import Text

        if text == self.shown:
            return
        self.shown = text
        if not self.console.is_terminal:
            self.console.print(Text(text), soft_wrap=True)
        elif self.live is None:  # as console.status(), but leaving sys.stdout alone: the tokens go there
            self.spinner = Spinner("dots", Text(text), style="status.spinner")
            self.live = Live(self.spinner, console=self.console, refresh_per_second=12.5, transient=True,
                             redirect_stdout=False, redirect_stderr=False)  # fmt: skip
            self.live.start()
        else:
            self.spinner.update(text=Text(text))

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
        self.live, self.shown = None, ""


def _standing(job: dict[str, Any]) -> str:
    """Where a waiting job stands: "#3 in queue, ~12 s" (no estimate until the server has timed a job)."""
    eta = job.get("eta_s")
    return f"#{job['position']} in queue" + ("" if eta is None else f", ~{_duration(eta)}")


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def _job_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options of a submission (`run` and `submit`)."""
    options = [
        click.argument("prompt"),
        click.option("--model", help="A model the server serves (GET /v1/models); default: its default model."),
        click.option("--priority", type=click.Choice(["interactive", "batch"]), help="Default: your key's class."),
        click.option("--max-tokens", type=click.IntRange(min=1), help="Default: the server's limit."),
        click.option("--temperature", type=click.FloatRange(0, 2), help="Sampling temperature (default 0: greedy)."),
        click.option("--ignore-eos", is_flag=True, help="Generate all --max-tokens, past the end of text."),
        click.option("--wait", is_flag=True, help="When the server is overloaded (429/503), retry after Retry-After."),
        click.option("--json", "as_json", is_flag=True, help="Print the job as JSON (for scripts)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _submit(client: Client, status: _Status, prompt: str, wait: bool, **fields: Any) -> dict[str, Any]:
    """Submit PROMPT ("-": stdin); with `wait`, an overloaded server is asked again after its Retry-After."""
    from tasks.client import ApiError

    text = sys.stdin.read() if prompt == "-" else prompt
    while True:
        try:
            return client.submit(text, **fields)
        except ApiError as exc:
            if not (wait and exc.overloaded and exc.retry_after_s is not None):
                raise
            status.show(f"{exc.message}; retrying in {exc.retry_after_s:g} s")
            time.sleep(exc.retry_after_s)


def _follow(client: Client, status: _Status, job_id: str, after: int = -1, tokens: bool = True) -> dict[str, Any]:
    """Show the job's standing on stderr and its tokens on stdout until it ends; return the ended job."""
    from tasks.client import TERMINAL

    out, last, streaming = sys.stdout, "\n", False
    try:
        for event in client.events(job_id, after=after):
            if event.type == "queued":
                status.show(_standing(event.data))
            elif event.type == "started":
                status.show("running")
            elif event.type == "token" and tokens:
                status.stop()  # before the first token: the spinner may share the terminal with stdout
                streaming = True
                out.write(event.data["text"])
                out.flush()
                last = event.data["text"][-1:] or last
            elif event.type == "requeued":
                out.write("" if last == "\n" else "\n")
                last = "\n"
                status.console.print("its worker died: the job is back at the front, and its output starts over")
            elif event.type == "reconnecting" and not (streaming and status.console.is_terminal):
                status.show(f"connection lost ({event.data['error']}); resuming")
            elif event.type in TERMINAL:
                return event.data
        raise AssertionError("unreachable: events() ends with a terminal event")
    finally:
        status.stop()
        if last != "\n":
            out.write("\n")
            out.flush()


def _report(console: Console, job: dict[str, Any], as_json: bool) -> None:
    """Print the ended job (JSON on stdout, or a summary on stderr); exit 1 unless it completed."""
    if as_json:
        click.echo(json.dumps(job, indent=2))
    if job["status"] != "completed":
        error = job.get("error")
        why = f": {error['message']} ({error['type']})" if error else ""
        raise click.ClickException(f"job {job['id']} {job['status']}{why}")
    if not as_json:
        t, tokens = job["timings"], job["usage"]["completion_tokens"]
        waited, ran = t["started_at"] - t["queued_at"], t["finished_at"] - t["started_at"]
        console.print(f"completed: {tokens} tokens ({job['finish_reason']}), waited {waited:.1f} s, ran {ran:.1f} s",
                      style="dim")  # fmt: skip


def _cancel_and_exit(client: Client, console: Console, job_id: str) -> NoReturn:
    from tasks.client import ClientError

    console.print(f"cancelling {job_id}")
    try:
        console.print(f"{job_id} {client.cancel(job_id)['status']}")
    except ClientError as exc:  # it ended meanwhile, or the server is gone
        console.print(f"could not cancel {job_id}: {exc}")
    sys.exit(EXIT_INTERRUPTED)


@main.command()
@_job_options
def run(prompt: str, wait: bool, as_json: bool, ignore_eos: bool, **fields: Any) -> None:
    """Submit PROMPT ("-": read stdin), show its place in the queue, then stream its tokens to stdout.

    Ctrl-C (or a closed terminal) cancels the job. Exit status: 0 if it completed, 1 if not, 130 after Ctrl-C.
    """
    client, console = _client()
    status = _Status(console)
    for signum in (signal.SIGTERM, signal.SIGHUP):  # a kill or a closed terminal cancels it as Ctrl-C does
        signal.signal(signum, signal.default_int_handler)
    job_id = None
    with _reported():
        try:
            job = _submit(client, status, prompt, wait, ignore_eos=ignore_eos or None, abandon_on_disconnect=True,
                          **fields)  # fmt: skip
            job_id = job["id"]
            status.stop()
            console.print(f"submitted {job_id}", style="dim")
            if job["status"] == "queued":
                status.show(_standing(job))
            ended = _follow(client, status, job_id, tokens=not as_json)
        except KeyboardInterrupt:
            status.stop()
            if job_id is None:
                console.print("interrupted: nothing submitted")
                sys.exit(EXIT_INTERRUPTED)
            _cancel_and_exit(client, console, job_id)
    _report(console, ended, as_json)


@main.command()
@_job_options
def submit(prompt: str, wait: bool, as_json: bool, ignore_eos: bool, **fields: Any) -> None:
    """Submit PROMPT ("-": read stdin) and print its job id at once (follow it with `onelane tail ID`)."""
    client, console = _client()
    with _reported():
        job = _submit(client, _Status(console), prompt, wait, ignore_eos=ignore_eos or None, **fields)
    click.echo(json.dumps(job, indent=2) if as_json else job["id"])


@main.command()
@click.argument("job_id")
@click.option("--from", "start", default=0, type=click.IntRange(min=0),
              help="Start at this event (the ids of the job's event stream); default: the first.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the ended job as JSON instead of its tokens.")
def tail(job_id: str, start: int, as_json: bool) -> None:
    """Follow a job: its place in the queue, then its tokens on stdout. Ctrl-C stops following; the job goes on."""
    client, console = _client()
    with _reported():
        try:
            ended = _follow(client, _Status(console), job_id, after=start - 1, tokens=not as_json)
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)
    _report(console, ended, as_json)


@main.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
def cancel(job_id: str, as_json: bool) -> None:
    """Cancel a job: a waiting one never runs; a running one stops within a step, keeping its partial output."""
    client, _ = _client()
    with _reported():
        job = client.cancel(job_id)
    click.echo(json.dumps(job, indent=2) if as_json else f"{job['id']} {job['status']}")


@main.command()
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 200))
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON.")
def jobs(limit: int, as_json: bool) -> None:
    """Your recent jobs, newest first."""
    from rich.console import Console
    from rich.table import Column, Table
    from rich.text import Text

    client, _ = _client()
    with _reported():
        listed = client.jobs(limit)
    if as_json:
        click.echo(json.dumps(listed, indent=2))
        return
    fixed = {"no_wrap": True}  # the id and the figures stay whole; the model and the prompt give way, cut short
    table = Table(Column("id", **fixed), Column("status", **fixed), Column("tokens", justify="right", **fixed),
                  Column("queued", **fixed), "model", "prompt", box=None)  # fmt: skip
    today = time.strftime("%Y-%m-%d")
    for job in listed:
        eta = "" if job["eta_s"] is None else f" ~{_duration(job['eta_s'])}"
        state = f"queued #{job['position']}{eta}" if job["status"] == "queued" else job["status"]
        prompt = job["prompt"] if job["prompt"] is not None else job["messages"][-1]["content"]
        queued = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job["timings"]["queued_at"]))
        cells = (job["model"], " ".join(prompt.split()))
        table.add_row(job["id"], Text(state, style=STATUS_STYLES.get(job["status"], "")),
                      str(job["usage"]["completion_tokens"]), queued.removeprefix(f"{today} "),
                      *(Text(cell, no_wrap=True, overflow="ellipsis") for cell in cells))  # fmt: skip
    Console(highlight=False).print(table)


if __name__ == "__main__":
    main()
