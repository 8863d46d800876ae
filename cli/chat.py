"""`onelane chat`: a conversation in the terminal, each line typed a turn answered with the whole conversation so far,
each turn a job that waits in the queue like any other."""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click

from cli.follow import follow, send
from cli.terminal import EXIT_INTERRUPTED, Status, connect, reported, stdout_closed

if TYPE_CHECKING:
    from rich.console import Console

    from cli.client import Client


class _Leaving(BaseException):
    """SIGTERM or SIGHUP (a kill, a closed terminal) during a chat: stop the answer, and leave."""


def _leave(*_: Any) -> NoReturn:
    raise _Leaving


@click.command()
@click.option("--model", help="A model the server serves (GET /v1/models); default: its default model.")
@click.option("--system", help="The system message every turn starts with.")
@click.option("--max-tokens", type=click.IntRange(min=1), help="Each answer's limit (default: the server's).")
@click.option("--temperature", type=click.FloatRange(0, 2), help="Sampling temperature (default 0: greedy).")
@click.option("--wait", is_flag=True, help="When the server is overloaded (429/503), retry after Retry-After.")
def chat(model: str | None, system: str | None, max_tokens: int | None, temperature: float | None, wait: bool) -> None:
    """Chat: each line you type is your turn, answered with the whole conversation so far (the server's prefix cache
    reads the history rather than computing it again). Each turn waits in the queue like any job, showing its place.

    Ctrl-C stops an answer (that turn is dropped) and the chat goes on; Ctrl-D or /bye leaves. A turn the server
    refuses or that fails is dropped too, said on stderr. Exit status: 0; 130 after Ctrl-C at the prompt, SIGTERM or
    a closed terminal; 141 when stdout was closed.
    """
    client, console = connect()
    status = Status(console)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _leave)
    if sys.stdin.isatty():
        import readline  # noqa: F401  (line editing and history for input())
    history = [{"role": "system", "content": system}] if system else []
    fields = {"model": model, "max_tokens": max_tokens, "temperature": temperature}
    while (line := _next_line(console)) is not None:
        if not line:
            continue
        turn = [*history, {"role": "user", "content": line}]
        ended = _answer(client, status, turn, wait, **fields)
        if ended is None:  # refused, or stopped: said already
            continue
        if ended["status"] == "completed":
            history = [*turn, {"role": "assistant", "content": ended["output"]}]
        else:
            error = ended.get("error") or {}
            console.print(f"{ended['status']}: {error.get('message', 'no answer')}; that turn is dropped", style="red")


def _next_line(console: Console) -> str | None:
    """The next line the user types (a prompt on a terminal); None at the end of input or at /bye."""
    try:
        if sys.stdin.isatty():
            console.print(">>> ", end="", style="bold")
        line = input().strip()
    except EOFError:
        return None
    except KeyboardInterrupt:
        console.print()
        sys.exit(EXIT_INTERRUPTED)
    return None if line == "/bye" else line


def _answer(
    client: Client, status: Status, turn: list[dict[str, str]], wait: bool, **fields: Any
) -> dict[str, Any] | None:
    """One turn: submitted, followed, its tokens streamed; the ended job, or None if it was refused or stopped (Ctrl-C:
    its job cancelled). A kill, or stdout's reader leaving, cancels it and exits."""
    from cli.client import ApiError

    job_id = None
    try:
        with reported():
            try:
                job = send(client, status, turn, wait, abandon_on_disconnect=True, **fields)
            except ApiError as exc:  # refused (overloaded, too long, …): this turn only
                status.stop()
                status.console.print(f"not sent: {exc}", style="red")
                return None
            job_id = job["id"]
            if job["status"] == "queued":
                status.show_standing(job)
            return follow(client, status, job_id)
    except (KeyboardInterrupt, _Leaving, BrokenPipeError) as stop:
        status.stop()
        if job_id is not None:
            _cancel_quietly(client, job_id)
        if isinstance(stop, BrokenPipeError):  # stdout's reader left: nobody reads the answers
            sys.exit(stdout_closed())
        if isinstance(stop, _Leaving):
            sys.exit(EXIT_INTERRUPTED)
        status.console.print("stopped: that turn is dropped", style="yellow")
        return None


def _cancel_quietly(client: Client, job_id: str) -> None:
    from cli.client import ClientError

    with contextlib.suppress(ClientError):  # it ended meanwhile, or the server is gone
        client.cancel(job_id)
