"""One onelane per folder and per port: a second `onelane up` (or `onelane redis`) where one runs is refused at once,
saying why and what to use instead, and takes nothing from the first (a second redis-server on the folder's socket
would unlink the first one's, cutting its web and worker off from their Redis for good). An `up` that was killed
outright leaves nothing that stops the next: neither its lock, nor its socket, nor its redis-server still running.

Real `onelane up` processes on the demo model, driven as a terminal drives them (tests/test_graceful_stop.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tasks.job import JobStatus
from tests.conftest import free_port, with_shim
from tests.helpers import EventStream, wait_answering
from tests.test_graceful_stop import ctrl_c, start_up

pytestmark = pytest.mark.timeout(300)  # a story here starts up to three whole onelanes
ENDED = {status.value for status in JobStatus if status.ended}


def up_env(var: Path, model: Path, port: int) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # `up` runs its own Redis
    return {
        **environ,
        "ONELANE_VAR_DIR": str(var),
        "ONELANE_MODEL": str(model),
        "ONELANE_PORT": str(port),
        "ONELANE_LEASE_S": "1",
        "ONELANE_DRAIN_S": "0",
    }


@dataclass
class Onelane:
    """An `onelane up` running: its process, where it answers, its folder."""

    up: subprocess.Popen[bytes]
    base: str
    var: Path
    log: Path

    @property
    def socket(self) -> Path:
        return self.var / "redis" / "redis.sock"


def start(var: Path, model: Path, port: int, log: Path) -> Onelane:
    running = Onelane(start_up(up_env(with_shim(var), model, port), log), f"http://127.0.0.1:{port}", var, log)
    try:
        wait_answering(f"{running.base}/readyz", running.up, timeout_s=90)
    except BaseException:
        stop(running)
        raise
    return running


def stop(running: Onelane) -> None:
    """Ctrl-C, and whatever happened, no redis-server of its folder left behind."""
    try:
        if running.up.poll() is None:
            ctrl_c(running.up, running.log)
    finally:
        for pid in redis_servers(running.var):
            os.kill(pid, signal.SIGKILL)


def redis_servers(var: Path) -> list[int]:
    """The redis-server processes serving the folder's socket."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = cmdline.read_bytes()  # (redis-server rewrites its own: "redis-server unixsocket:PATH")
        except OSError:
            continue
        if command.split()[:1] and command.split()[0].endswith(b"redis-server") and str(var).encode() in command:
            found.append(int(cmdline.parent.name))
    return found


def ask(running: Onelane, prompt: str) -> dict[str, object]:
    """Submit a job and follow its events to its end; the ended job."""
    response = requests.post(f"{running.base}/v1/jobs", json={"prompt": prompt, "max_tokens": 4}, timeout=10)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    stream = EventStream(running.base, job_id)
    try:
        next(e for e in stream if e.get("event") in ENDED)
    finally:
        stream.close()
    return requests.get(f"{running.base}/v1/jobs/{job_id}", timeout=10).json()  # type: ignore[no-any-return]


def assert_serves(running: Onelane) -> None:
    """Its Redis still answers on its socket: ready, and a job submitted now runs to its end."""
    assert running.up.poll() is None and running.socket.is_socket()
    # ready (within a while: on a loaded machine its idle worker can miss a heartbeat, lapse its lease for a moment,
    # and take the device back, as a CI run beside two others once saw)
    wait_answering(f"{running.base}/readyz", running.up, timeout_s=30)
    assert ask(running, "still there?")["status"] == "completed"


def attempt(env: dict[str, str], *args: str) -> tuple[int, str]:
    """Run `onelane ARGS` as a terminal would; its exit code and what it said. One that does not exit at once is
    stopped (Ctrl-C) and fails the story."""
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGINT)
        process.communicate(timeout=90)
        pytest.fail(f"`onelane {' '.join(args)}` was not refused: it ran")
    return process.returncode, out.decode()


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> Iterator[Onelane]:
    """A onelane that runs for the whole module; each story tries to start another beside it."""
    var = tmp_path_factory.mktemp("first")
    running = start(var, demo_model, free_port(), var / "up.log")
    yield running
    stop(running)


def test_a_second_up_in_the_same_folder_is_refused_naming_the_first_which_runs_on(first, demo_model):
    redis_before = redis_servers(first.var)

    code, said = attempt(up_env(first.var, demo_model, free_port()), "up")

    assert code == 1, said
    assert f"another onelane (pid {first.up.pid}) runs its Redis in {first.var / 'redis'}" in said, said
    assert "ONELANE_VAR_DIR=" in said and f"REDIS_URL=unix://{first.socket}" in said
    assert redis_servers(first.var) == redis_before
    assert_serves(first)


def test_onelane_redis_in_a_folder_in_use_is_refused_likewise(first, demo_model):
    code, said = attempt(up_env(first.var, demo_model, free_port()), "redis")

    assert code == 1 and f"another onelane (pid {first.up.pid}) runs its Redis" in said, said
    assert_serves(first)


@pytest.mark.parametrize("folder", ["the same folder", "another folder"])
def test_a_second_up_on_the_same_port_is_refused_before_it_starts_anything(first, demo_model, tmp_path, folder):
    var = first.var if folder == "the same folder" else tmp_path / "var"
    redis_before = redis_servers(first.var)

    code, said = attempt(up_env(var, demo_model, int(first.base.rsplit(":", 1)[1])), "up")

    port = first.base.rsplit(":", 1)[1]
    assert code == 1, said
    assert (
        f"port {port} is in use (another onelane up?): pick another with `onelane up --port N` or ONELANE_PORT=N"
        in said
    )
    assert not (tmp_path / "var").exists()  # (another folder: nothing made in it)
    assert redis_servers(first.var) == redis_before
    assert_serves(first)


def client_env(var: Path, **extra: str) -> dict[str, str]:
    """A terminal in the folder onelane up was started from: ONELANE_URL set only where `extra` sets it."""
    environ = {k: v for k, v in os.environ.items() if k not in ("ONELANE_URL", "ONELANE_API_KEY")}
    return {**environ, "ONELANE_VAR_DIR": str(var), **extra}


def test_the_client_finds_the_web_that_up_runs_from_its_folder_and_an_explicit_url_wins(first):
    # Given onelane up on a port of its own, not 8000, and no ONELANE_URL
    assert not first.base.endswith(":8000")

    # When the client runs from its folder, Then it reaches that web
    code, said = attempt(client_env(first.var), "run", "found you", "--max-tokens", "3", "--ignore-eos")
    assert code == 0 and "completed: 3 tokens" in said, said

    # And ONELANE_URL, when set, wins over the record, and is named when it does not answer
    nobody = f"http://127.0.0.1:{free_port()}"
    code, said = attempt(client_env(first.var, ONELANE_URL=nobody), "jobs")
    assert code == 1 and f"cannot reach onelane at {nobody} (ONELANE_URL)" in said, said


def test_an_up_killed_outright_leaves_a_record_the_client_refuses_at_once_saying_why(tmp_path, demo_model):
    # Given a onelane up killed with its terminal's whole process group: its record of the web stays
    var = tmp_path / "var"
    running = start(var, demo_model, free_port(), tmp_path / "up.log")
    try:
        os.killpg(running.up.pid, signal.SIGKILL)
        running.up.wait()
        assert (var / "web.json").exists()

        # When the client runs from its folder, Then it says what ended and what to do, without a request
        began = time.monotonic()
        code, said = attempt(client_env(var), "jobs")
        assert code == 1 and time.monotonic() - began < 10, said
        assert f"the onelane up that served {running.base} from here (pid {running.up.pid}" in said, said
        assert "start it again with `onelane up`, or set ONELANE_URL" in " ".join(said.split()), said
    finally:
        stop(running)


def test_up_names_the_port_when_it_is_taken_between_its_check_and_the_webs_bind(tmp_path, demo_model):
    # Given a port free when onelane up checks it, and taken by another program as soon as up has started its Redis
    # (after the check, before its web binds)
    var, port = tmp_path / "var", free_port()
    taken = threading.Event()

    def take_the_port() -> None:
        while not (var / "redis" / "redis.sock").exists():
            time.sleep(0.005)  # a poll: the socket file is what up leaves as it passes the check
        occupant.bind(("127.0.0.1", port))
        occupant.listen()
        taken.set()

    with socket.socket() as occupant:
        threading.Thread(target=take_the_port, daemon=True).start()

        # When onelane up starts, Then it stops everything, naming the port and how to pick another
        log = tmp_path / "up.log"
        up = start_up(up_env(with_shim(var), demo_model, port), log)
        try:
            assert up.wait(timeout=90) == 1, log.read_text()
        finally:
            stop(Onelane(up, f"http://127.0.0.1:{port}", var, log))
        said = " ".join(log.read_text().split())
        assert taken.is_set()
        assert f"the web could not listen: port {port} is in use (another onelane up?): pick another with " in said
        assert "`onelane up --port N` or ONELANE_PORT=N; stopping everything" in said
        assert "Traceback" not in said and not redis_servers(var)
        assert not (var / "web.json").exists()  # its record went with it


def test_an_up_killed_outright_leaves_nothing_that_stops_the_next(tmp_path, demo_model):
    var, port, log = tmp_path / "var", free_port(), tmp_path / "up.log"

    # Given a onelane that answered a job, then was killed with its terminal's whole process group: its
    # redis-server, in a session of its own, lives on with the folder's lock file and socket
    running = start(var, demo_model, port, log)
    try:
        answered = ask(running, "remember me")
        os.killpg(running.up.pid, signal.SIGKILL)
        running.up.wait()
        (left_running,) = redis_servers(var)

        # When onelane up starts again there, Then it runs: the redis-server left behind was stopped (its data
        # kept), and no two serve the folder
        running = start(var, demo_model, port, log)
        (serving,) = redis_servers(var)
        assert serving != left_running
        job = requests.get(f"{running.base}/v1/jobs/{answered['id']}", timeout=10).json()
        assert job["status"] == "completed" and job["output"] == answered["output"]
        assert_serves(running)

        # And when everything is killed, its redis-server too (a power cut), the lock and the socket file it left
        # stop nothing either
        os.killpg(running.up.pid, signal.SIGKILL)
        os.kill(serving, signal.SIGKILL)
        running.up.wait()
        while redis_servers(var):
            time.sleep(0.05)  # a poll: another process's end announces nothing here
        assert (var / "redis" / "onelane.lock").exists() and running.socket.exists()
        running = start(var, demo_model, port, log)
        assert_serves(running)
    finally:
        stop(running)


def test_ctrl_c_while_up_starts_its_redis_leaves_nothing_behind(tmp_path, demo_model):
    # Given onelane up starting, its redis-server (in a session of its own) just spawned and not yet answering
    var, log = tmp_path / "var", tmp_path / "up.log"
    up = start_up(up_env(with_shim(var), demo_model, free_port()), log)
    try:
        deadline = time.monotonic() + 60
        while not redis_servers(var):
            assert up.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.002)  # a poll: nothing announces another process's start
        # When the terminal's Ctrl-C comes, Then up stops quietly, with 0, and takes its Redis with it
        ctrl_c(up, log)
        assert not redis_servers(var) and not (var / "web.json").exists()
    finally:
        stop(Onelane(up, "", var, log))  # (whatever failed: no redis-server left running)
