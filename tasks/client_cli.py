"""The terminal client's commands: run, chat, submit, tail, jobs, cancel and batch talk to a running web over HTTP
(tasks/client.py), at ONELANE_URL (else the `onelane up` of this folder: tasks/client_url.py) with ONELANE_API_KEY.
A job's tokens go to stdout, so it pipes; its standing and errors go to stderr. tasks/cli.py adds them to the
`onelane` command.

The client's imports (rich, and requests through tasks.client) wait until one of these commands runs: `onelane web`
must let gevent patch ssl before they are imported.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from tasks.events import TERMINAL

if TYPE_CHECKING:
    from rich.console import Console
    from rich.live import Live

    from tasks.client import Client

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports after a Ctrl-C
EXIT_STDOUT_CLOSED = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader left (`| head`)
BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")  # tasks/batches.py's (it imports redis)
BATCH_POLL_S = 1.0  # how often a followed batch is asked for
STATUS_STYLES = {"completed": "green", "failed": "red", "expired": "red", "cancelled": "yellow", "in_progress": "cyan"}


def _client() -> tuple[Client, Console]:
    from rich.console import Console

    from tasks.client import Client
    from tasks.client_url import StaleRecord

    try:
        return Client.from_env(), Console(stderr=True, highlight=False)
    except StaleRecord as exc:
        raise click.ClickException(str(exc)) from None


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
        return f"#{position} in queue" + ("" if left is None else f", ~{_duration(left)}")

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
        click.option(
            "--priority",
            type=click.Choice(["interactive", "batch"]),
            help="Default: your key's class (interactive without keys).",
        ),
        click.option(
            "--max-tokens",
            type=click.IntRange(min=1),
            help="Default: the server's ONELANE_DEFAULT_MAX_TOKENS (256 unless set); at most its "
            "ONELANE_MAX_TOKENS_LIMIT.",
        ),
        click.option("--temperature", type=click.FloatRange(0, 2), help="Sampling temperature (default 0: greedy)."),
        click.option("--ignore-eos", is_flag=True, help="Generate all --max-tokens, past the end of text."),
        click.option(
            "--raw",
            is_flag=True,
            help="Send PROMPT as text to continue, without the model's chat template "
            "(default: PROMPT is your turn of a chat).",
        ),
        click.option(
            "--schema",
            "response_format",
            type=click.Path(path_type=Path),  # (its own errors: one line, where click's show the usage)
            callback=_read_schema,
            help="Answer with JSON of the JSON schema in this file (response_format json_schema): each token is "
            "drawn under its grammar.",
        ),
        click.option("--json-object", is_flag=True, help="Answer with a JSON object (response_format json_object)."),
        click.option("--wait", is_flag=True, help="When the server is overloaded (429/503), retry after Retry-After."),
        click.option("--json", "as_json", is_flag=True, help="Print the job as JSON (for scripts)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


class _UsageError(click.ClickException):
    """A mistake in the command line, said in one line: exit status 2, as click's own usage errors."""

    exit_code = 2


def _read_schema(ctx: click.Context, param: click.Parameter, path: Path | None) -> dict[str, Any] | None:
    """--schema FILE: the response_format of an answer that must be JSON of the schema the file holds."""
    from tasks.client import json_format

    if path is None:
        return None
    try:
        schema = json.loads(path.read_bytes())
    except OSError as exc:
        raise _UsageError(f"--schema {path}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError is a ValueError)
        raise _UsageError(f"--schema {path}: not a JSON file ({exc})") from None
    if not isinstance(schema, dict):
        raise _UsageError(f"--schema {path}: a JSON schema is a JSON object")
    return json_format(schema, re.sub(r"[^A-Za-z0-9_-]", "_", path.stem)[:64] or "schema")


def _answer_format(response_format: dict[str, Any] | None, json_object: bool) -> dict[str, Any] | None:
    """What --schema or --json-object asks the answer to be (None: text)."""
    from tasks.client import json_format

    if json_object and response_format is not None:
        raise _UsageError("--schema and --json-object: give one of them")
    return json_format() if json_object else response_format


def _submit(
    client: Client, status: _Status, prompt: str | list[dict[str, str]], wait: bool, **fields: Any
) -> dict[str, Any]:
    """Submit PROMPT ("-": stdin; a list: a conversation); with `wait`, an overloaded server is asked again after its
    Retry-After."""
    from tasks.client import ApiError

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


def _follow(client: Client, status: _Status, job_id: str, after: int = -1, tokens: bool = True) -> dict[str, Any]:
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
        console.print(
            f"completed: {tokens} tokens ({job['finish_reason']}), waited {waited:.1f} s, ran {ran:.1f} s", style="dim"
        )


def _stdout_closed() -> int:
    """Stdout's reader left (`onelane run … | head`): point stdout at /dev/null, so that exiting flushes nothing
    into the broken pipe (Python's "Exception ignored … BrokenPipeError"); the exit status to report."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_STDOUT_CLOSED


def _cancel_and_exit(client: Client, console: Console, job_id: str, code: int = EXIT_INTERRUPTED) -> NoReturn:
    from tasks.client import ClientError

    console.print(f"cancelling {job_id}")
    try:
        console.print(f"{job_id} {client.cancel(job_id)['status']}")
    except ClientError as exc:  # it ended meanwhile, or the server is gone
        console.print(f"could not cancel {job_id}: {exc}")
    sys.exit(code)


@click.command()
@_job_options
def run(prompt: str, wait: bool, as_json: bool, ignore_eos: bool, json_object: bool, **fields: Any) -> None:
    """Submit PROMPT ("-": read stdin), show its place in the queue, then stream its tokens to stdout.

    With --schema FILE the answer is JSON of that JSON schema (--json-object: any JSON object), enforced as it is
    generated. Ctrl-C (or a closed terminal, or stdout's reader leaving, as `| head` does) cancels the job. Exit
    status: 0 if it completed, 1 if not, 2 for a command line in error (a --schema file that is not JSON), 130 after
    Ctrl-C, 141 when stdout was closed.
    """
    fields["response_format"] = _answer_format(fields["response_format"], json_object)
    client, console = _client()
    status = _Status(console)
    for signum in (signal.SIGTERM, signal.SIGHUP):  # a kill or a closed terminal cancels it as Ctrl-C does
        signal.signal(signum, signal.default_int_handler)
    job_id = None
    with _reported():
        try:
            job = _submit(
                client, status, prompt, wait, ignore_eos=ignore_eos or None, abandon_on_disconnect=True, **fields
            )
            job_id = job["id"]
            status.stop()
            console.print(f"submitted {job_id}", style="dim")
            if job["status"] == "queued":
                status.show_standing(job)
            ended = _follow(client, status, job_id, tokens=not as_json)
        except (KeyboardInterrupt, BrokenPipeError) as stop:  # Ctrl-C, or stdout's reader left: nobody wants it
            status.stop()
            code = _stdout_closed() if isinstance(stop, BrokenPipeError) else EXIT_INTERRUPTED
            if job_id is None:
                console.print("interrupted: nothing submitted")
                sys.exit(code)
            _cancel_and_exit(client, console, job_id, code)
    _report(console, ended, as_json)


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
    client, console = _client()
    status = _Status(console)
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
    client: Client, status: _Status, turn: list[dict[str, str]], wait: bool, **fields: Any
) -> dict[str, Any] | None:
    """One turn: submitted, followed, its tokens streamed; the ended job, or None if it was refused or stopped (Ctrl-C:
    its job cancelled). A kill, or stdout's reader leaving, cancels it and exits."""
    from tasks.client import ApiError

    job_id = None
    try:
        with _reported():
            try:
                job = _submit(client, status, turn, wait, abandon_on_disconnect=True, **fields)
            except ApiError as exc:  # refused (overloaded, too long, …): this turn only
                status.stop()
                status.console.print(f"not sent: {exc}", style="red")
                return None
            job_id = job["id"]
            if job["status"] == "queued":
                status.show_standing(job)
            return _follow(client, status, job_id)
    except (KeyboardInterrupt, _Leaving, BrokenPipeError) as stop:
        status.stop()
        if job_id is not None:
            _cancel_quietly(client, job_id)
        if isinstance(stop, BrokenPipeError):  # stdout's reader left: nobody reads the answers
            sys.exit(_stdout_closed())
        if isinstance(stop, _Leaving):
            sys.exit(EXIT_INTERRUPTED)
        status.console.print("stopped: that turn is dropped", style="yellow")
        return None


def _cancel_quietly(client: Client, job_id: str) -> None:
    from tasks.client import ClientError

    with contextlib.suppress(ClientError):  # it ended meanwhile, or the server is gone
        client.cancel(job_id)


@click.command()
@_job_options
def submit(prompt: str, wait: bool, as_json: bool, ignore_eos: bool, json_object: bool, **fields: Any) -> None:
    """Submit PROMPT ("-": read stdin) and print its job id at once (follow it with `onelane tail ID`)."""
    fields["response_format"] = _answer_format(fields["response_format"], json_object)
    client, console = _client()
    with _reported():
        job = _submit(client, _Status(console), prompt, wait, ignore_eos=ignore_eos or None, **fields)
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
    client, console = _client()
    with _reported():
        try:
            ended = _follow(client, _Status(console), job_id, after=start - 1, tokens=not as_json)
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)
    _report(console, ended, as_json)


@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
def cancel(job_id: str, as_json: bool) -> None:
    """Cancel a job: a waiting one never runs; a running one stops within a step, keeping its partial output."""
    client, _ = _client()
    with _reported():
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

    client, _ = _client()
    with _reported():
        listed = client.jobs(limit)
    if as_json:
        click.echo(json.dumps(listed, indent=2))
        return
    fixed = {"no_wrap": True}  # the id and the figures stay whole; the model and the prompt give way, cut short
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
        eta = "" if job["eta_s"] is None else f" ~{_duration(job['eta_s'])}"
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


def _beside(file: Path, kind: str) -> Path:
    """Where a batch's result file goes by default: a.jsonl -> a.output.jsonl, a.errors.jsonl."""
    return file.with_name(f"{file.stem}.{kind}.jsonl")


def _create_batch(client: Client, file: Path, endpoint: str) -> dict[str, Any]:
    """Upload FILE (purpose `batch`) and create its batch on `endpoint`."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise click.FileError(str(file), exc.strerror) from None
    return client.create_batch(client.upload_file(file.name, data)["id"], endpoint)


def _progress(batch: dict[str, Any]) -> str:
    """Where a batch stands: "batch_x: in_progress, 12/1000 done, 3 failed" (done: the lines with a result)."""
    counts = batch["request_counts"]
    failed = f", {counts['failed']} failed" if counts["failed"] else ""
    return f"{batch['id']}: {batch['status']}, {counts['completed'] + counts['failed']}/{counts['total']} done{failed}"


def _follow_batch(client: Client, status: _Status, batch: dict[str, Any]) -> dict[str, Any]:
    """Show the batch's progress on stderr, asking for it about once a second, until it ends; return the ended batch.

    A server that cannot answer for now (unreachable, overloaded, 5xx) is asked again for RESUME_FOR_S at most."""
    from tasks.batches import ENDED
    from tasks.client import RESUME_FOR_S, ApiError, ClientError

    note, failing_since = "", None
    try:
        while batch["status"] not in ENDED:
            status.show(_progress(batch) + note)
            time.sleep(BATCH_POLL_S)
            try:
                batch, note, failing_since = client.get_batch(batch["id"]), "", None
            except ClientError as exc:
                failing_since = failing_since or time.monotonic()
                transient = not isinstance(exc, ApiError) or exc.overloaded or exc.status >= 500
                if not transient or time.monotonic() - failing_since > RESUME_FOR_S:
                    raise
                note = f" ({exc}; asking again)"
        return batch
    finally:
        status.stop()


def _cancel_batch(client: Client, status: _Status, batch_id: str) -> dict[str, Any]:
    """After Ctrl-C: cancel the batch and follow it until it ended (what completed is kept); a second Ctrl-C, or a
    server that cannot cancel it, leaves at once with exit status 130."""
    from tasks.client import ClientError

    status.console.print(f"cancelling {batch_id} (Ctrl-C again to leave at once)")
    try:
        return _follow_batch(client, status, client.cancel_batch(batch_id))
    except KeyboardInterrupt:
        status.console.print(f"left {batch_id} while it was cancelling; its files are not written")
    except ClientError as exc:
        status.console.print(f"could not cancel {batch_id}: {exc}")
    sys.exit(EXIT_INTERRUPTED)


def _save_batch(client: Client, batch: dict[str, Any], output: Path, errors: Path) -> list[Path]:
    """Write the ended batch's output and error files to their paths (empty where the batch has none: no file of an
    earlier run is left to mislead); none for a failed batch, which ran nothing."""
    written: list[Path] = []
    if batch["status"] == "failed":
        return written
    for file_id, path in ((batch["output_file_id"], output), (batch["error_file_id"], errors)):
        data = client.file_content(file_id) if file_id is not None else b""
        try:
            path.write_bytes(data)
        except OSError as exc:
            raise click.FileError(str(path), f"{exc.strerror} (the server keeps it as {file_id})") from None
        written.append(path)
    return written


def _batch_summary(batch: dict[str, Any], written: list[Path], errors: Path) -> str:
    """What the ended batch did: "batch_x completed: 3/4 answered, 1 failed (see a.errors.jsonl); wrote …"."""
    counts = batch["request_counts"]
    text = f"{batch['id']} {batch['status']}: {counts['completed']}/{counts['total']} answered"
    if counts["failed"]:
        text += f", {counts['failed']} failed" + (f" (see {errors})" if errors in written else "")
    for error in (batch["errors"] or {}).get("data", []):
        text += f"; {error['message']} ({error['code']})"
    return text + (f"; wrote {', '.join(map(str, written))}" if written else "; no file to write")


def _report_batch(
    console: Console, batch: dict[str, Any], written: list[Path], errors: Path, as_json: bool, interrupted: bool
) -> None:
    """Print the ended batch (JSON on stdout) and its summary on stderr; exit 130 after Ctrl-C, else 1 unless it
    completed."""
    if as_json:
        click.echo(json.dumps(batch, indent=2))
    summary = _batch_summary(batch, written, errors)
    if batch["status"] != "completed" and not interrupted:
        raise click.ClickException(summary)
    console.print(summary, soft_wrap=True)
    if interrupted:
        sys.exit(EXIT_INTERRUPTED)


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path))
@click.option(
    "--endpoint",
    type=click.Choice(BATCH_ENDPOINTS),
    default=BATCH_ENDPOINTS[0],
    show_default=True,
    help="The endpoint of every line (each line's `url` names it).",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Write the answered lines here (default: beside FILE, a.jsonl -> a.output.jsonl).",
)
@click.option(
    "--errors",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Write the lines that failed here (default: beside FILE, a.jsonl -> a.errors.jsonl).",
)
@click.option("--no-wait", is_flag=True, help="Print the batch's id once it is created, and leave it running.")
@click.option("--json", "as_json", is_flag=True, help="Print the ended batch as JSON (for scripts).")
def batch(file: Path, endpoint: str, output: Path | None, errors: Path | None, no_wait: bool, as_json: bool) -> None:
    """Run FILE, a JSONL file of requests (OpenAI's Batch API input), as a batch: upload it, create the batch, show
    its progress until it ends, then write its output and error files (each result line names its custom_id).

    Ctrl-C cancels the batch, waits until it ended and writes what completed (a second Ctrl-C leaves at once). Exit
    status: 0 if it completed (the lines that failed are in the errors file), 1 if not, 130 after Ctrl-C.
    """
    client, console = _client()
    status = _Status(console)
    output, errors = output or _beside(file, "output"), errors or _beside(file, "errors")
    batch_id, interrupted = None, False
    with _reported():
        try:
            created = _create_batch(client, file, endpoint)
            batch_id = created["id"]
            if no_wait:
                click.echo(json.dumps(created, indent=2) if as_json else batch_id)
                return
            console.print(f"created {batch_id}: {created['request_counts']['total']} lines", style="dim")
            ended = _follow_batch(client, status, created)
        except KeyboardInterrupt:
            if batch_id is None:
                console.print("interrupted: no batch created")
                sys.exit(EXIT_INTERRUPTED)
            ended, interrupted = _cancel_batch(client, status, batch_id), True
        try:
            written = _save_batch(client, ended, output, errors)
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)
    _report_batch(console, ended, written, errors, as_json, interrupted)
