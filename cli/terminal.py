"""What the terminal client's commands share: the client with its console on stderr, the client's errors said in one
line, the status line, durations in words, and the exit statuses.

A job's tokens go to stdout, so it pipes; its standing and errors go to stderr. The client talks to a running web
over HTTP (cli/client.py), at ONELANE_URL (else the `onelane up` of this folder: cli/url.py) with ONELANE_API_KEY.
Its imports (rich, and requests through cli.client) wait until one of its commands runs: `onelane web` must let
gevent patch ssl before they are imported.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from rich.console import Console
    from rich.live import Live

    from cli.client import Client

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports after a Ctrl-C
EXIT_STDOUT_CLOSED = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader left (`| head`)


def connect() -> tuple[Client, Console]:
    """The client of the web the environment names (cli/url.py), and a console on stderr for what is not output."""
    from rich.console import Console

    from cli.client import Client
    from cli.url import StaleRecord

    try:
        return Client.from_env(), Console(stderr=True, highlight=False)
    except StaleRecord as exc:
        raise click.ClickException(str(exc)) from None


@contextmanager
def reported() -> Iterator[None]:
    """The client's errors as one line on stderr and exit status 1 (with the wait an overloaded server asks)."""
    from cli.client import ApiError, ClientError

    try:
        yield
    except ApiError as exc:
        wait = f"; retry after {exc.retry_after_s:g} s" if exc.retry_after_s is not None else ""
        raise click.ClickException(f"{exc}{wait}") from None
    except ClientError as exc:
        raise click.ClickException(str(exc)) from None


class Status:
    """One transient status line on stderr: a spinner on a terminal, whose ETA counts down between two the server
    tells; elsewhere each new text once, as a line."""

    def __init__(self, console: Console) -> None:
        self.console, self.shown = console, ""
        self.live: Live | None = None
        self.waiting: tuple[int, float | None, float] | None = None  # position, ETA, when told

    def show(self, text: str) -> None:
        self.waiting = None
        self._show(text)

    def show_standing(self, job: dict[str, Any]) -> None:
        """Where a waiting job stands: "#3 in queue, ~12 s" (no ETA while no worker holds the device)."""
        self.waiting = (job["position"], job.get("eta_s"), time.monotonic())
        self._show(self._standing())

    def _standing(self) -> str:
        assert self.waiting is not None
        position, eta, told = self.waiting
        left = None if eta is None else max(eta - (time.monotonic() - told), 0.0)
        return f"#{position} in queue" + ("" if left is None else f", ~{duration(left)}")

    def _show(self, text: str) -> None:
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
            self.live = Live(
                get_renderable=self._render,
                console=self.console,
                refresh_per_second=12.5,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self.live.start()
        else:
            self.spinner.update(text=Text(text))

    def _render(self) -> Any:
        from rich.text import Text

        if self.waiting is not None:  # the countdown
            self.spinner.update(text=Text(self._standing()))
        return self.spinner

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
        self.live, self.shown, self.waiting = None, "", None


def duration(seconds: float) -> str:
    """A duration in words, as precise as it is worth: "4.2 s", "37 s", "12 min", "1.5 h"."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def stdout_closed() -> int:
    """Stdout's reader left (`onelane run … | head`): point stdout at /dev/null, so that exiting flushes nothing
    into the broken pipe (Python's "Exception ignored … BrokenPipeError"); the exit status to report."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_STDOUT_CLOSED
