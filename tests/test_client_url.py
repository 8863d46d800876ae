"""How `onelane up` records its web for the terminal client (cli/url.py), and how the client trusts only a record
that this user's own `up` wrote: a web.json planted in the folder never gets the API key, nor any request. The stories
with a real `onelane up` are in tests/test_one_onelane.py."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.process import describe
from cli.url import DEFAULT_URL, Found, StaleRecord, find, forget, record


@pytest.fixture
def an_up(tmp_path: Path) -> Iterator[int]:
    """A process of this user whose command line is `onelane up`'s, which records itself in tmp_path as up does; its
    pid."""
    path = str(tmp_path / "web.json")
    code = f"import sys, pathlib, cli.url; cli.url.record(pathlib.Path({path!r}), '0.0.0.0', 8123); print(flush=True)"
    up = subprocess.Popen(
        [sys.executable, "-c", f"{code}; sys.stdin.read()", "onelane", "up"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert up.stdout is not None and up.stdout.readline() == b"\n"  # recorded
        yield up.pid
    finally:
        assert up.stdin is not None
        up.stdin.close()
        up.wait(timeout=30)


def test_a_web_listening_everywhere_is_recorded_on_loopback_and_an_explicit_url_wins(tmp_path, an_up):
    env = {"ONELANE_VAR_DIR": str(tmp_path)}  # (an_up recorded its web on 0.0.0.0:8123)

    assert find(env).url == "http://127.0.0.1:8123"
    assert stat.S_IMODE((tmp_path / "web.json").stat().st_mode) == 0o600  # for its owner's eyes only
    assert find({**env, "ONELANE_URL": "http://gpu.example:9000"}) == Found("http://gpu.example:9000", "ONELANE_URL")


def test_up_forgets_only_its_own_record(tmp_path):
    path = tmp_path / "web.json"
    path.write_text(json.dumps({"url": "http://127.0.0.1:9001", "pid": os.getppid()}))  # another up's

    forget(path)
    assert path.exists()

    record(path, "127.0.0.1", 9002)
    forget(path)
    assert not path.exists()


def test_a_record_of_an_ended_up_or_an_unreadable_one_is_refused_saying_what_to_do(tmp_path):
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "web.json").write_text(json.dumps({"url": "http://127.0.0.1:9003", "pid": int(ended.stdout)}))
    with pytest.raises(StaleRecord, match=r"pid \d+, recorded in .* has ended: start it again with `onelane up`"):
        find({"ONELANE_VAR_DIR": str(tmp_path)})

    (tmp_path / "web.json").write_text("{")
    with pytest.raises(StaleRecord, match="is unreadable .*: remove it, or set ONELANE_URL"):
        find({"ONELANE_VAR_DIR": str(tmp_path)})


def plant(var: Path, url: str, pid: int, started: str | None = None) -> Path:
    """A web.json that no `onelane up` wrote, as a checkout or a shared folder could ship it (mode 0600, ours)."""
    path = var / "web.json"
    path.write_text(json.dumps({"url": url, "pid": pid, "started": started}))
    path.chmod(0o600)
    return path


def started(pid: int) -> str:
    process = describe(pid)
    assert process is not None
    return process.started


@pytest.mark.parametrize("pid", [1, os.getpid()], ids=["pid 1", "this test's pid"])
def test_a_planted_record_never_receives_a_request_nor_the_key(tmp_path, pid):
    # Given a folder that ships a web.json naming a port this test listens on, and a live pid of this user with its
    # true start time (what a forger on this machine could read)
    with socket.socket() as trap:
        trap.bind(("127.0.0.1", 0))
        trap.listen()
        plant(tmp_path, f"http://127.0.0.1:{trap.getsockname()[1]}", pid, started(pid))

        # When the client runs there with an API key and no ONELANE_URL
        environ = {k: v for k, v in os.environ.items() if k != "ONELANE_URL"}
        env = {**environ, "ONELANE_VAR_DIR": str(tmp_path), "ONELANE_API_KEY": "sk-not-for-strangers"}
        ran = subprocess.run(
            [sys.executable, "-m", "cli.main", "jobs"], env=env, capture_output=True, text=True, timeout=90
        )

        # Then nothing connected to the trap, and the client said in one line why it ignored the record
        trap.setblocking(False)
        try:
            caller, _ = trap.accept()
        except BlockingIOError:
            pass
        else:
            caller.settimeout(5)
            pytest.fail(f"the planted record's URL got a connection: {caller.recv(4096)!r}")
    ignored = [line for line in ran.stderr.splitlines() if "ignoring" in line]
    assert len(ignored) == 1 and f"pid {pid} is " in ignored[0], ran.stderr
    assert f"{tmp_path / 'web.json'}" in ignored[0] and "http://127.0.0.1:8000" in ignored[0], ran.stderr


@pytest.mark.parametrize("mode", [0o666, 0o620, 0o602], ids=oct)
def test_a_record_others_can_write_is_ignored(tmp_path, an_up, mode, capsys):
    path = tmp_path / "web.json"
    path.chmod(mode)

    found = find({"ONELANE_VAR_DIR": str(tmp_path)})

    assert found == Found(DEFAULT_URL, f"the default, {path} being ignored; set ONELANE_URL to where onelane runs")
    assert f"others can write it (mode {mode:o})" in capsys.readouterr().err


def test_a_record_in_a_folder_others_can_write_is_ignored(tmp_path, an_up, capsys):
    tmp_path.chmod(0o777)

    assert find({"ONELANE_VAR_DIR": str(tmp_path)}).url == DEFAULT_URL
    assert "others can write its folder (mode 777)" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file away")
def test_a_record_of_another_user_is_ignored(tmp_path, an_up, capsys):
    os.chown(tmp_path / "web.json", 4242, -1)

    assert find({"ONELANE_VAR_DIR": str(tmp_path)}).url == DEFAULT_URL
    assert "it belongs to uid 4242, not to you" in capsys.readouterr().err


def test_a_record_naming_a_host_other_than_loopback_is_ignored(tmp_path, an_up, capsys):
    plant(tmp_path, "http://192.0.2.1:8000", an_up, started(an_up))

    assert find({"ONELANE_VAR_DIR": str(tmp_path)}).url == DEFAULT_URL
    assert "it names http://192.0.2.1:8000, not this machine's loopback" in capsys.readouterr().err


def test_a_record_whose_pid_now_runs_another_process_is_of_an_up_that_ended(tmp_path, an_up):
    plant(tmp_path, "http://127.0.0.1:8123", an_up, "1")  # its pid, given to a later process

    with pytest.raises(StaleRecord, match=rf"pid {an_up}, recorded in .* has ended"):
        find({"ONELANE_VAR_DIR": str(tmp_path)})
