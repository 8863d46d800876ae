"""`onelane batch FILE.jsonl`: OpenAI's Batch API from the terminal. It uploads the file, creates the batch, shows
its progress until it ends, then writes its output and error files beside FILE."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli.terminal import EXIT_INTERRUPTED, Status, connect, reported
from tasks.endpoints import ENDPOINTS

if TYPE_CHECKING:
    from rich.console import Console

    from cli.client import Client

BATCH_POLL_S = 1.0  # how often a followed batch is asked for


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


def _follow_batch(client: Client, status: Status, batch: dict[str, Any]) -> dict[str, Any]:
    """Show the batch's progress on stderr, asking for it about once a second, until it ends; return the ended batch.

    A server that cannot answer for now (unreachable, overloaded, 5xx) is asked again for RESUME_FOR_S at most."""
    from cli.client import RESUME_FOR_S, ApiError, ClientError
    from tasks.batches import ENDED

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


def _cancel_batch(client: Client, status: Status, batch_id: str) -> dict[str, Any]:
    """After Ctrl-C: cancel the batch and follow it until it ended (what completed is kept); a second Ctrl-C, or a
    server that cannot cancel it, leaves at once with exit status 130."""
    from cli.client import ClientError

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
    type=click.Choice(ENDPOINTS),
    default=ENDPOINTS[0],
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
    client, console = connect()
    status = Status(console)
    output, errors = output or _beside(file, "output"), errors or _beside(file, "errors")
    batch_id, interrupted = None, False
    with reported():
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
