"""The terminal client's commands on jobs: `run` (submit, then stream the tokens), `submit`, `tail`, `cancel` and
`jobs` (a table of the caller's recent ones). cli/main.py adds them to the `onelane` command."""

from __future__ import annotations

import json
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, NoReturn

import click

from cli.follow import follow, report, send
from cli.options import answer_format, job_options
from cli.terminal import EXIT_INTERRUPTED, Status, connect, duration, reported, stdout_closed

if TYPE_CHECKING:
    from rich.console import Console

    from cli.client import Client

STATUS_STYLES = {"completed": "green", "failed": "red", "expired": "red", "cancelled": "yellow", "in_progress": "cyan"}


@click.command()
@job_options
def run(prompt: str, wait: bool, as_json: bool, ignore_eos: bool, json_object: bool, **fields: Any) -> None:
    """Submit PROMPT ("-": read stdin), show its place in the queue, then stream its tokens to stdout.

    With --schema FILE the answer is JSON of that JSON schema (--json-object: any JSON object), enforced as it is
    generated. Ctrl-C (or a closed terminal, or stdout's reader leaving, as `| head` does) cancels the job. Exit
    status: 0 if it completed, 1 if not, 2 for a command line in error (a --schema file that is not JSON), 130 after
    Ctrl-C, 141 when stdout was closed.
    """
    fields["response_format"] = answer_format(fields["response_format"], json_object)
    client, console = connect()
    status = Status(console)
    for signum in (signal.SIGTERM, signal.SIGHUP):  # a kill or a closed terminal cancels it as Ctrl-C does
        signal.signal(signum, signal.default_int_handler)
    job_id = None
    with reported():
        try:
            job = send(
                client, status, prompt, wait, ignore_eos=ignore_eos or None, abandon_on_disconnect=True, **fields
            )
            job_id = job["id"]
            status.stop()
            console.print(f"submitted {job_id}", style="dim")
            if job["status"] == "queued":
                status.show_standing(job)
            ended = follow(client, status, job_id, tokens=not as_json)
        except (KeyboardInterrupt, BrokenPipeError) as stop:  # Ctrl-C, or stdout's reader left: nobody wants it
            status.stop()
            code = stdout_closed() if isinstance(stop, BrokenPipeError) else EXIT_INTERRUPTED
            if job_id is None:
                console.print("interrupted: nothing submitted")
                sys.exit(code)
            _cancel_and_exit(client, console, job_id, code)
    report(console, ended, as_json)


def _cancel_and_exit(client: Client, console: Console, job_id: str, code: int = EXIT_INTERRUPTED) -> NoReturn:
    from cli.client import ClientError

    console.print(f"cancelling {job_id}")
    try:
        console.print(f"{job_id} {client.cancel(job_id)['status']}")
    except ClientError as exc:  # it ended meanwhile, or the server is gone
        console.print(f"could not cancel {job_id}: {exc}")
    sys.exit(code)


@click.command()
@job_options
def submit(prompt: str, wait: bool, as_json: bool, ignore_eos: bool, json_object: bool, **fields: Any) -> None:
    """Submit PROMPT ("-": read stdin) and print its job id at once (follow it with `onelane tail ID`)."""
    fields["response_format"] = answer_format(fields["response_format"], json_object)
    client, console = connect()
    with reported():
        job = send(client, Status(console), prompt, wait, ignore_eos=ignore_eos or None, **fields)
    click.echo(json.dumps(job, indent=2) if as_json else job["id"])


@click.command()
@click.argument("job_id")
@click.option(
    "--from",
    "start",
    default=0,
    type=click.IntRange(min=0),
    help="Start at this event (the ids of the job's event stream); default: the first.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the ended job as JSON instead of its tokens.")
def tail(job_id: str, start: int, as_json: bool) -> None:
    """Follow a job: its place in the queue, then its tokens on stdout. Ctrl-C stops following; the job goes on."""
    client, console = connect()
    with reported():
        try:
            ended = follow(client, Status(console), job_id, after=start - 1, tokens=not as_json)
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)
    report(console, ended, as_json)


@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
def cancel(job_id: str, as_json: bool) -> None:
    """Cancel a job: a waiting one never runs; a running one stops within a step, keeping its partial output."""
    client, _ = connect()
    with reported():
        job = client.cancel(job_id)
    click.echo(json.dumps(job, indent=2) if as_json else f"{job['id']} {job['status']}")


@click.command()
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 200))
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON.")
def jobs(limit: int, as_json: bool) -> None:
    """Your recent jobs, newest first."""
    from rich.console import Console
    from rich.table import Column, Table
    from rich.text import Text

    client, _ = connect()
    with reported():
        listed = client.jobs(limit)
    if as_json:
        click.echo(json.dumps(listed, indent=2))
        return
    # the id and the figures stay whole; the model and the prompt give way, cut short
    fixed: dict[str, Any] = {"no_wrap": True}
    table = Table(
        Column("id", **fixed),
        Column("status", **fixed),
        Column("tokens", justify="right", **fixed),
        Column("queued", **fixed),
        "model",
        "prompt",
        box=None,
    )
    today = time.strftime("%Y-%m-%d")
    for job in listed:
        eta = "" if job["eta_s"] is None else f" ~{duration(job['eta_s'])}"
        state = f"queued #{job['position']}{eta}" if job["status"] == "queued" else job["status"]
        prompt = job["prompt"] if job["prompt"] is not None else job["messages"][-1]["content"]
        queued = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job["timings"]["queued_at"]))
        cells = (job["model"], " ".join(prompt.split()))
        table.add_row(
            job["id"],
            Text(state, style=STATUS_STYLES.get(job["status"], "")),
            str(job["usage"]["completion_tokens"]),
            queued.removeprefix(f"{today} "),
            *(Text(cell, no_wrap=True, overflow="ellipsis") for cell in cells),
        )
    Console(highlight=False).print(table)
