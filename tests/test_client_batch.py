"""`onelane batch FILE.jsonl` against a live stack (real server, worker and Redis): it uploads the file, creates the
batch, follows it and writes its output and error files; --no-wait; errors in one line; Ctrl-C cancels the batch and
writes what it kept, and a second Ctrl-C leaves at once."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
import requests
from click.testing import CliRunner, Result

from cli.client import ApiError, Client
from cli.main import main
from tasks import keys
from tasks.batches import BatchStore, job_id_of
from tests.helpers import BUSY, DEMO, chat_line, wait_event
from tests.test_client import read_until, start

MODEL = DEMO
pytestmark = pytest.mark.default_catalog


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A folder of the story's own (tmp_path holds the server's var dir)."""
    (tmp_path / "files").mkdir()
    return tmp_path / "files"


def write_jsonl(path: Path, *lines: Any) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def onelane(url: str, *args: str, key: str | None = None) -> Result:
    """`onelane ARGS` in this process, at ONELANE_URL=`url`; anything but an exit (a traceback) fails the test."""
    env = {"ONELANE_URL": url, "ONELANE_API_KEY": key, "COLUMNS": "200"}
    done = CliRunner().invoke(main, list(args), env=env)
    assert done.exception is None or isinstance(done.exception, SystemExit), done.exc_info
    return done


def created_id(stderr: str) -> str:
    return re.search(r"(batch_[0-9a-f]+): in_progress", stderr).group(1)  # type: ignore[union-attr]


def test_a_batch_writes_its_output_and_error_files_beside_its_input_and_exits_0(folder, live_server, start_worker):
    # Given a file of three good requests and one for an endpoint a batch does not run
    start_worker()
    source = write_jsonl(
        folder / "requests.jsonl",
        *(chat_line(f"ok-{n}") for n in range(3)),
        {**chat_line("elsewhere"), "url": "/v1/embeddings"},
    )

    # When `onelane batch` runs it
    done = onelane(live_server, "batch", str(source))

    # Then it completed (exit 0), the answers beside the input, the line that failed in the errors file, said so
    assert done.exit_code == 0, done.output
    output, errors = folder / "requests.output.jsonl", folder / "requests.errors.jsonl"
    answers = read_jsonl(output)
    assert sorted(line["custom_id"] for line in answers) == ["ok-0", "ok-1", "ok-2"]
    assert all(line["response"]["status_code"] == 200 and line["error"] is None for line in answers)
    assert [(line["custom_id"], line["error"]["code"]) for line in read_jsonl(errors)] == [("elsewhere", "invalid_url")]
    batch_id = created_id(done.stderr)
    assert f"created {batch_id}: 4 lines" in done.stderr
    assert f"{batch_id}: in_progress, " in done.stderr  # its progress, as it went
    assert f"{batch_id} completed: 3/4 answered, 1 failed (see {errors}); wrote {output}, {errors}" in done.stderr
    assert done.stdout == ""


def test_json_prints_the_ended_batch_and_the_files_go_where_asked(folder, live_server, start_worker):
    start_worker()
    line = {
        "custom_id": "c",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3, "temperature": 0},
    }
    source = write_jsonl(folder / "in.jsonl", line)
    output, errors = folder / "answers.jsonl", folder / "failures.jsonl"

    done = onelane(
        live_server,
        "batch",
        str(source),
        "--endpoint",
        "/v1/completions",
        "--output",
        str(output),
        "--errors",
        str(errors),
        "--json",
    )

    assert done.exit_code == 0, done.output
    batch = json.loads(done.stdout)
    assert (batch["status"], batch["endpoint"], batch["request_counts"]) == (
        "completed",
        "/v1/completions",
        {"total": 1, "completed": 1, "failed": 0},
    )
    assert batch["error_file_id"] is None and errors.read_bytes() == b""  # nothing failed: an empty errors file
    served = requests.get(f"{live_server}/v1/files/{batch['output_file_id']}/content", timeout=10)
    assert output.read_bytes() == served.content and read_jsonl(output)[0]["custom_id"] == "c"
    assert sorted(p.name for p in folder.iterdir()) == ["answers.jsonl", "failures.jsonl", "in.jsonl"]


def test_no_wait_prints_the_id_of_a_batch_the_server_knows(folder, live_server):
    source = write_jsonl(folder / "later.jsonl", chat_line("a"), chat_line("b"))  # (no worker: it waits)

    done = onelane(live_server, "batch", str(source), "--no-wait")

    assert done.exit_code == 0, done.output
    batch_id = done.stdout.strip()
    known = requests.get(f"{live_server}/v1/batches/{batch_id}", timeout=10).json()
    assert (known["id"], known["status"], known["request_counts"]["total"]) == (batch_id, "in_progress", 2)
    assert list(folder.iterdir()) == [source]  # nothing written: the batch goes on


@pytest.mark.parametrize(
    "content, said",
    [
        (b"\n", r"the file is empty \(400 invalid_request\w*\)"),  # refused at upload
        (b"this is not\nJSON lines\n", r"batch_\w+ failed: 0/0 answered; .+ \(invalid_file\); no file to write"),
    ],
)
def test_what_the_server_refuses_is_one_line_and_exit_1(folder, live_server, content, said):
    source = folder / "bad.jsonl"
    source.write_bytes(content)

    done = onelane(live_server, "batch", str(source))

    assert done.exit_code == 1 and done.stdout == ""
    assert re.fullmatch(f"Error: {said}\n", done.stderr.splitlines(keepends=True)[-1]), done.stderr
    assert list(folder.iterdir()) == [source]


def test_an_unreachable_server_or_a_missing_file_is_one_line(folder, live_server):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{s.getsockname()[1]}"
    source = write_jsonl(folder / "r.jsonl", chat_line("a"))

    unreachable = onelane(nowhere, "batch", str(source))
    missing = onelane(live_server, "batch", str(folder / "nope.jsonl"))

    assert unreachable.exit_code == 1 and unreachable.stdout == ""
    assert unreachable.stderr.startswith(f"Error: cannot reach onelane at {nowhere} (ONELANE_URL): ")
    assert unreachable.stderr.count("\n") == 1 and "Traceback" not in unreachable.stderr
    assert missing.exit_code == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    with pytest.raises(ApiError) as refused:  # (a file id the server does not know, as the client says it)
        Client(live_server).create_batch("file-nope", "/v1/chat/completions")
    assert (refused.value.status, refused.value.param) == (404, "input_file_id")


def test_a_server_with_keys_takes_a_batch_from_onelane_api_key_only(folder, settings, make_app):
    from werkzeug.serving import make_server

    keyed = settings.model_copy(update={"users": settings.model_validate({"users": "alice:ka"}).users})
    server = make_server("127.0.0.1", 0, make_app(keyed), threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    source = write_jsonl(folder / "r.jsonl", chat_line("a"))
    try:
        refused = onelane(url, "batch", str(source))
        taken = onelane(url, "batch", str(source), "--no-wait", key="ka")
    finally:
        server.shutdown()

    assert refused.exit_code == 1
    assert refused.stderr == (
        f"Error: {url} needs an API key: set ONELANE_API_KEY to yours, e.g. `export ONELANE_API_KEY=KEY` "
        "(401 authentication_error)\n"
    )
    assert taken.exit_code == 0 and taken.stdout.startswith("batch_"), taken.output


def test_ctrl_c_cancels_the_batch_waits_for_its_end_and_writes_what_it_kept(folder, live_server, start_worker, store):
    # Given `onelane batch` following a batch whose one line runs on and on
    start_worker()
    source = write_jsonl(folder / "long.jsonl", chat_line("long", tokens=BUSY))
    run = start(live_server, "batch", str(source))
    batch_id = created_id(read_until(run.stderr, ": in_progress"))
    wait_event(store, job_id_of(batch_id, 0), lambda e: e.type == "token")

    # When Ctrl-C
    run.send_signal(signal.SIGINT)

    # Then the batch is cancelled, its line in the errors file, and the client exits 130 once it ended
    assert run.wait(timeout=30) == 130
    said = run.stderr.read().decode()  # type: ignore[union-attr]
    assert f"cancelling {batch_id}" in said and "Traceback" not in said
    errors = folder / "long.errors.jsonl"
    output = folder / "long.output.jsonl"
    assert f"{batch_id} cancelled: 0/1 answered, 1 failed (see {errors}); wrote {output}, {errors}" in said
    assert BatchStore(store.redis, store.settings).get(batch_id).status == "cancelled"
    assert [(line["custom_id"], line["error"]["code"]) for line in read_jsonl(errors)] == [("long", "batch_cancelled")]
    assert output.read_bytes() == b"" and run.stdout.read() == b""  # type: ignore[union-attr]


def test_a_second_ctrl_c_leaves_at_once_while_the_batch_is_cancelling(folder, live_server, store):
    # Given `onelane batch` following a batch whose rounds are held off (its lock is taken here): a cancel stays
    # `cancelling`
    source = write_jsonl(folder / "held.jsonl", chat_line("a"))
    run = start(live_server, "batch", str(source))
    batch_id = created_id(read_until(run.stderr, ": in_progress"))
    lock = store.redis.lock(keys.batch_lock(batch_id), timeout=30, blocking_timeout=10)
    assert lock.acquire()
    try:
        # When Ctrl-C, and again while it waits for the batch to end
        run.send_signal(signal.SIGINT)
        read_until(run.stderr, f"{batch_id}: cancelling")
        run.send_signal(signal.SIGINT)

        # Then it exits 130 at once, the batch still cancelling, nothing written
        assert run.wait(timeout=30) == 130
        said = run.stderr.read().decode()  # type: ignore[union-attr]
        assert f"left {batch_id} while it was cancelling" in said and "Traceback" not in said
        assert BatchStore(store.redis, store.settings).get(batch_id).status == "cancelling"
        assert list(folder.iterdir()) == [source]
    finally:
        lock.release()
