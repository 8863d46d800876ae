"""The options of a submission (`run` and `submit`): the prompt, its model and sampling, and the answer's format
(--schema FILE, --json-object), read into the request's `response_format`."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click


class UsageError(click.ClickException):
    """A mistake in the command line, said in one line: exit status 2, as click's own usage errors."""

    exit_code = 2


def job_options(command: Callable[..., None]) -> Callable[..., None]:
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
        click.option(
            "--image",
            "images",
            multiple=True,
            type=click.Path(path_type=Path),  # (its own errors: one line)
            callback=_read_images,
            help="Ask about this image (PNG, JPEG, WebP, GIF; again for more), for a model that reads images.",
        ),
        click.option("--wait", is_flag=True, help="When the server is overloaded (429/503), retry after Retry-After."),
        click.option("--json", "as_json", is_flag=True, help="Print the job as JSON (for scripts)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _read_schema(ctx: click.Context, param: click.Parameter, path: Path | None) -> dict[str, Any] | None:
    """--schema FILE: the response_format of an answer that must be JSON of the schema the file holds."""
    from cli.client import json_format

    if path is None:
        return None
    try:
        schema = json.loads(path.read_bytes())
    except OSError as exc:
        raise UsageError(f"--schema {path}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError is a ValueError)
        raise UsageError(f"--schema {path}: not a JSON file ({exc})") from None
    if not isinstance(schema, dict):
        raise UsageError(f"--schema {path}: a JSON schema is a JSON object")
    return json_format(schema, re.sub(r"[^A-Za-z0-9_-]", "_", path.stem)[:64] or "schema")


def _read_images(ctx: click.Context, param: click.Parameter, paths: tuple[Path, ...]) -> list[str] | None:
    """--image FILE...: each image as a data: URL (the server reads and bounds it)."""
    import base64
    import mimetypes

    urls = []
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise UsageError(f"--image {path}: {exc.strerror or exc}") from None
        mime = _sniffed(data) or mimetypes.guess_type(path.name)[0] or "image/png"
        urls.append(f"data:{mime};base64,{base64.b64encode(data).decode()}")
    return urls or None


def _sniffed(data: bytes) -> str | None:
    """An image's type, from its first bytes (a file's name may say otherwise)."""
    for magic, mime in ((b"\x89PNG", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif")):
        if data.startswith(magic):
            return mime
    return "image/webp" if data[:4] == b"RIFF" and data[8:12] == b"WEBP" else None


def answer_format(response_format: dict[str, Any] | None, json_object: bool) -> dict[str, Any] | None:
    """What --schema or --json-object asks the answer to be (None: text)."""
    from cli.client import json_format

    if json_object and response_format is not None:
        raise UsageError("--schema and --json-object: give one of them")
    return json_format() if json_object else response_format
