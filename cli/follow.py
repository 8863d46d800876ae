"""One job from the terminal: submitted (with --wait, again after the Retry-After of an overloaded server),
followed (its standing on stderr, its tokens on stdout) and reported once it ended. `run`, `tail` and `chat` share it.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from tasks.events import TERMINAL

if TYPE_CHECKING:
    from rich.console import Console

    from cli.client import Client
    from cli.terminal import Status


def send(
    client: Client, status: Status, prompt: str | list[dict[str, str]], wait: bool, **fields: Any
) -> dict[str, Any]:
    """Submit PROMPT ("-": stdin; a list: a conversation); with `wait`, an overloaded server is asked again after its
    Retry-After."""
    from cli.client import ApiError

    # a file's (or echo's) last line break is no part of the prompt, and changes the answer; the rest is kept as is
    text = sys.stdin.read().rstrip("\r\n") if prompt == "-" else prompt
    while True:
        try:
            return client.submit(text, **fields)
        except ApiError as exc:
            if not (wait and exc.overloaded and exc.retry_after_s is not None):
                raise
            status.show(f"{exc.message}; retrying in {exc.retry_after_s:g} s")
            time.sleep(exc.retry_after_s)


def follow(client: Client, status: Status, job_id: str, after: int = -1, tokens: bool = True) -> dict[str, Any]:
    """Show the job's standing on stderr and its tokens on stdout until it ends; return the ended job."""
    out, last, streaming = sys.stdout, "\n", False
    try:
        for event in client.events(job_id, after=after):
            # once tokens share the terminal with the status line, it keeps quiet: the answer goes on in its line
            quiet = streaming and status.console.is_terminal
            if event.type == "token" and tokens:
                status.stop()  # before the first token: the spinner may share the terminal with stdout
                streaming = True
                out.write(event.data["text"])
                out.flush()
                last = event.data["text"][-1:] or last
            elif event.type in TERMINAL:
                return event.data
            elif quiet:
                continue
            elif event.type == "queued":
                status.show_standing(event.data)
            elif event.type == "started":
                status.show("running")
            elif event.type == "requeued":  # its next run goes on from what was written: nothing to take back
                status.show("its worker stopped: back at the front of the queue, to go on where it was")
            elif event.type == "reconnecting":
                status.show(f"connection lost ({event.data['error']}); resuming")
        raise AssertionError("unreachable: events() ends with a terminal event")
    except BrokenPipeError:
        last = "\n"  # nobody reads stdout any more: nothing to end with a newline
        raise
    finally:
        status.stop()
        if last != "\n":
            out.write("\n")
            out.flush()


def report(console: Console, job: dict[str, Any], as_json: bool) -> None:
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
        console.print(
            f"completed: {tokens} tokens ({job['finish_reason']}), waited {waited:.1f} s, ran {ran:.1f} s", style="dim"
        )
