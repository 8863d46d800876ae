"""The terminal client (`onelane run`, `submit`, `jobs`, `cancel`, `tail`) as a real process against a live stack."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from cli.client import Client, ServerEvent, lines, parse_sse
from tests.helpers import BUSY, wait_ended, wait_event
from tests.netproxy import listen


def onelane_env(url: str, **extra: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k != "ONELANE_API_KEY"}
    return {**environ, "ONELANE_URL": url, "COLUMNS": "200", **extra}


def onelane(url: str, *args: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    """Run `onelane ARGS` to its end, `stdin` as its input; stdout decoded as is (no newline translation: tokens may
    hold a \\r)."""
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        env=onelane_env(url, **env),
        input=stdin.encode(),
        capture_output=True,
        timeout=90,
    )
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


def start(url: str, *args: str) -> subprocess.Popen[bytes]:
    """The client as a terminal starts it: with Ctrl-C's default action even when this suite runs in the background
    (where a shell starts everything with SIGINT ignored, and a child inherits that)."""
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", *args],
        env=onelane_env(url),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def read_until(pipe, text: str) -> str:  # type: ignore[no-untyped-def]
    """Read lines from a process's pipe until one holds `text` (no sleeps; pytest's timeout bounds it)."""
    seen = ""
    while text not in seen:
        line = pipe.readline().decode()
        assert line, f"the pipe closed before {text!r}; it said: {seen!r}"
        seen += line
    return seen


def job_id_in(text: str) -> str:
    return re.search(r"submitted (job_[\w-]+)", text).group(1)  # type: ignore[union-attr]


def printed(output: str) -> str:
    """What the client prints for a job's output: the output, ending in a newline."""
    return output if output.endswith("\n") or not output else output + "\n"


@pytest.fixture
def serve(make_app):  # type: ignore[no-untyped-def]
    """Serve an app built from other settings on a real socket, as live_server does; yields a starter."""
    from werkzeug.serving import make_server

    servers = []

    def start_server(settings) -> str:  # type: ignore[no-untyped-def]
        server = make_server("127.0.0.1", 0, make_app(settings), threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield start_server
    for server in servers:
        server.shutdown()


def test_run_streams_the_tokens_to_stdout_and_exits_0(jobs, start_worker, live_server):
    start_worker()

    done = onelane(live_server, "run", "tell me a story", "--max-tokens", "12", "--ignore-eos")

    assert done.returncode == 0, done.stderr
    job = jobs.get(job_id_in(done.stderr))
    assert job["status"] == "completed" and job["usage"]["completion_tokens"] == 12
    assert done.stdout == printed(job["output"])
    assert "completed: 12 tokens" in done.stderr


def test_run_shows_its_place_in_the_queue_and_ctrl_c_cancels_it(jobs, store, start_worker, live_server):
    # Given the worker busy with a long job
    start_worker()
    busy = jobs.submit("busy", max_tokens=BUSY, ignore_eos=True)
    wait_event(store, busy["id"], lambda e: e.type == "token")
    try:
        # When `onelane run` waits behind it
        run = start(live_server, "run", "patience", "--max-tokens", "5")
        said = read_until(run.stderr, "in queue")

        # Then it says where it stands, and Ctrl-C cancels the job and exits 130
        assert "#1 in queue" in said
        job_id = job_id_in(said)
        run.send_signal(signal.SIGINT)
        assert run.wait(timeout=30) == 130
        assert f"{job_id} cancelled" in run.stderr.read().decode()  # type: ignore[union-attr]
        assert run.stdout.read() == b""  # type: ignore[union-attr]
        job = jobs.get(job_id)
        assert job["status"] == "cancelled" and job["usage"]["completion_tokens"] == 0

        # And `onelane jobs` lists it, newest first
        listed = onelane(live_server, "jobs")
        assert listed.returncode == 0, listed.stderr
        rows = [line for line in listed.stdout.splitlines() if "job_" in line]
        assert job_id in rows[0] and "cancelled" in rows[0]
        assert busy["id"] in rows[1] and "in_progress" in rows[1]
    finally:
        jobs.cancel(busy["id"])


def test_ctrl_c_while_streaming_cancels_the_running_job_keeping_its_partial_output(
    jobs, store, start_worker, live_server
):
    start_worker()
    run = start(live_server, "run", "on and on", "--max-tokens", str(BUSY), "--ignore-eos")
    job_id = job_id_in(read_until(run.stderr, "submitted"))
    first = run.stdout.read1(1)  # type: ignore[union-attr]  # tokens are streaming

    run.send_signal(signal.SIGINT)

    assert run.wait(timeout=30) == 130
    assert f"{job_id} cancelled" in run.stderr.read().decode()  # type: ignore[union-attr]
    job = wait_ended(store, job_id)
    assert job["status"] == "cancelled" and job["finish_reason"] == "cancelled"
    shown = (first + run.stdout.read()).decode()  # type: ignore[union-attr]
    assert shown and job["output"].startswith(shown.rstrip("\n"))
    assert 0 < job["usage"]["completion_tokens"] < BUSY


def test_a_reader_that_leaves_cancels_the_job_as_ctrl_c_does(store, start_worker, live_server):
    # Given `onelane run` streaming an endless job into a reader that leaves after one byte (as `| head -c 1` does)
    start_worker()
    run = start(live_server, "run", "on and on", "--max-tokens", str(BUSY), "--ignore-eos")
    job_id = job_id_in(read_until(run.stderr, "submitted"))
    assert run.stdout.read1(1)  # type: ignore[union-attr]

    # When the reader closes the pipe
    run.stdout.close()  # type: ignore[union-attr]

    # Then the client cancels its job and exits 141 (128 + SIGPIPE, as a shell reports), saying so, no traceback
    assert run.wait(timeout=30) == 141
    assert wait_ended(store, job_id)["status"] == "cancelled"
    said = run.stderr.read().decode()  # type: ignore[union-attr]
    assert f"{job_id} cancelled" in said
    assert "Traceback" not in said and "Exception ignored" not in said and "Error" not in said


def test_submit_prints_the_id_and_cancel_cancels_the_waiting_job(jobs, live_server):
    submitted = onelane(live_server, "submit", "nobody runs me", "--max-tokens", "4")  # no worker: it waits
    job_id = submitted.stdout.strip()
    assert submitted.returncode == 0 and jobs.get(job_id)["status"] == "queued"

    cancelled = onelane(live_server, "cancel", job_id)

    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout == f"{job_id} cancelled\n"
    assert jobs.get(job_id)["status"] == "cancelled"
    tailed = onelane(live_server, "tail", job_id)  # a job that did not complete: said, and exit status 1
    assert tailed.returncode == 1 and f"job {job_id} cancelled" in tailed.stderr and tailed.stdout == ""
    missing = onelane(live_server, "cancel", "job_nope")
    assert missing.returncode == 1 and "404 not_found" in missing.stderr


def test_tail_prints_a_finished_jobs_output_from_the_start_or_from_an_event(jobs, store, start_worker, live_server):
    start_worker()
    job = jobs.submit("tail me", max_tokens=20, ignore_eos=True)
    done = wait_ended(store, job["id"])

    whole = onelane(live_server, "tail", job["id"])
    later = onelane(live_server, "tail", job["id"], "--from", "2")

    assert whole.returncode == 0 and whole.stdout == printed(done["output"])
    rest = "".join(e.text for e in store.events(job["id"], 2) if e.type == "token")
    assert later.returncode == 0 and later.stdout == printed(rest)
    ended = onelane(live_server, "cancel", job["id"])  # it ended otherwise: nothing to cancel
    assert ended.returncode == 1 and "409 job_ended" in ended.stderr


def test_overload_says_when_to_retry_and_wait_retries_after_it(jobs, settings, serve):
    # Given a queue of one place, taken
    url = serve(settings.model_copy(update={"max_queue": 1}))
    blocker = onelane(url, "submit", "first", "--max-tokens", "4").stdout.strip()

    # Then a run is refused, and says when to try again
    refused = onelane(url, "run", "second")
    assert refused.returncode == 1
    assert "503 queue_full" in refused.stderr and re.search(r"retry after \d+ s", refused.stderr)

    # And with --wait it retries after Retry-After until the place frees
    run = start(url, "run", "second", "--wait", "--max-tokens", "4")
    read_until(run.stderr, "retrying in")
    assert onelane(url, "cancel", blocker).returncode == 0
    job_id = job_id_in(read_until(run.stderr, "#1 in queue"))
    run.send_signal(signal.SIGINT)
    assert run.wait(timeout=30) == 130
    assert onelane(url, "cancel", job_id).stdout == f"{job_id} cancelled\n"


def test_run_help_tells_the_defaults_the_server_applies():
    from click.testing import CliRunner

    from cli.jobs import run

    shown = " ".join(CliRunner().invoke(run, ["--help"]).output.split())

    # --max-tokens defaults to the server's ONELANE_DEFAULT_MAX_TOKENS (256), not to its limit (4096)
    assert "the server's limit" not in shown
    assert "--max-tokens INTEGER RANGE Default: the server's ONELANE_DEFAULT_MAX_TOKENS (256 unless set)" in shown
    assert "Default: your key's class (interactive without keys)" in shown


def test_the_api_key_comes_from_the_environment_and_a_401_says_to_set_it(settings, serve):
    url = serve(settings.model_copy(update={"users": settings.model_validate({"users": "alice:ka"}).users}))

    refused = onelane(url, "jobs")
    wrong = onelane(url, "jobs", ONELANE_API_KEY="kb")
    allowed = onelane(url, "jobs", ONELANE_API_KEY="ka")

    # A 401 says what to set, and how
    assert refused.returncode == 1 and refused.stderr == (
        f"Error: {url} needs an API key: set ONELANE_API_KEY to yours, e.g. `export ONELANE_API_KEY=KEY` "
        "(401 unauthorized)\n"
    )
    assert wrong.returncode == 1 and wrong.stderr == (
        f"Error: {url} refused the key in ONELANE_API_KEY: invalid API key; set it to a key it knows "
        "(401 unauthorized)\n"
    )
    assert allowed.returncode == 0, allowed.stderr


class CuttingProxy:
    """A TCP proxy that cuts the first event stream through it in the middle of its second token event."""

    def __init__(self, target_port: int) -> None:
        self.target_port, self.cut = target_port, False
        self.listener = listen(lambda client: threading.Thread(target=self._serve, args=(client,), daemon=True).start())
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self, client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", self.target_port)) as upstream:
            request = client.recv(65536)
            cut = b"/events" in request and not self.cut
            self.cut = self.cut or cut
            upstream.sendall(request)
            threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
            sent = b""
            while chunk := upstream.recv(65536):
                whole = sent + chunk
                at = _nth(whole, b"event: token", 2) if cut else -1
                client.sendall(whole[len(sent) :] if at < 0 else whole[len(sent) : at + 10])
                if at >= 0:  # mid-event: hang up both ways (shutdown: the pump's recv holds the sockets open)
                    client.shutdown(socket.SHUT_RDWR)
                    upstream.shutdown(socket.SHUT_RDWR)
                    return
                sent = whole

    def close(self) -> None:
        self.listener.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass


def _nth(data: bytes, needle: bytes, n: int) -> int:
    at = -1
    for _ in range(n):
        at = data.find(needle, at + 1)
        if at < 0:
            return -1
    return at


@pytest.fixture
def cutting_proxy(live_server) -> Iterator[CuttingProxy]:  # type: ignore[no-untyped-def]
    proxy = CuttingProxy(int(live_server.rsplit(":", 1)[1]))
    yield proxy
    proxy.close()


def test_a_dropped_stream_resumes_with_last_event_id_without_gap_or_duplicate(jobs, store, start_worker, cutting_proxy):
    job = jobs.submit("resume me", max_tokens=200, ignore_eos=True)
    store.follow_live(store.get(job["id"]))  # as a stream opened on it would: its tokens written as they come
    start_worker()
    done = wait_ended(store, job["id"])
    assert sum(e.type == "token" for e in store.events(job["id"])) >= 3  # so the cut falls mid-stream

    tailed = onelane(cutting_proxy.url, "tail", job["id"])

    assert cutting_proxy.cut
    assert "connection lost" in tailed.stderr and "resuming" in tailed.stderr
    assert tailed.returncode == 0 and tailed.stdout == printed(done["output"])


def test_events_arrive_as_they_are_sent_from_a_server_that_does_not_chunk():
    # Given an HTTP/1.0 server (as behind some proxies): a body without chunks, ended by closing the connection
    server, first_read, in_time = socket.create_server(("127.0.0.1", 0)), threading.Event(), []

    def answer() -> None:
        connection, _ = server.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(
                b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
                b'event: queued\ndata: {"position": 1, "eta_s": null}\n\n'
            )
            in_time.append(first_read.wait(timeout=5))  # the client has the first event before the rest is sent
            connection.sendall(b'id: 0\nevent: cancelled\ndata: {"status": "cancelled"}\n\n')

    threading.Thread(target=answer, daemon=True).start()
    client = Client(f"http://127.0.0.1:{server.getsockname()[1]}")
    seen = []
    for event in client.events("job_x"):
        seen.append(event)
        first_read.set()
    server.close()

    assert in_time == [True]
    assert seen == [
        ServerEvent("queued", {"position": 1, "eta_s": None}),
        ServerEvent("cancelled", {"status": "cancelled"}, 0),
    ]


def test_server_sent_events_parse_across_chunks_with_crlf_comments_and_multiline_data():
    chunks = [b"retry: 1000\r\n\r\n: ping\n\nid: 3\nevent: tok", b'en\ndata: {"text":\ndata: "a"}\n', b"\nevent: x"]

    events = list(parse_sse(lines(chunks)))

    assert events == [ServerEvent("retry", {"ms": 1000}), ServerEvent("token", {"text": "a"}, 3)]


def test_a_prompt_is_a_chat_turn_unless_raw(live_server):
    client = Client(live_server, None)
    chat = client.submit("What is the capital of France?", max_tokens=4)
    raw = client.submit("The capital of France is", raw=True, max_tokens=4)
    assert (chat["prompt"], chat["messages"]) == (None, [{"role": "user", "content": "What is the capital of France?"}])
    assert (raw["prompt"], raw["messages"]) == ("The capital of France is", None)
    done = onelane(live_server, "submit", "--raw", "--json", "continue this", "--max-tokens", "4")
    assert json.loads(done.stdout)["prompt"] == "continue this", done.stderr
