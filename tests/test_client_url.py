"""How `onelane up` records its web for the terminal client (cli/url.py); the stories with real processes
are in tests/test_one_onelane.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cli.url import Found, StaleRecord, find, forget, record


def test_a_web_listening_everywhere_is_recorded_on_loopback_and_an_explicit_url_wins(tmp_path):
    env = {"ONELANE_VAR_DIR": str(tmp_path)}
    record(tmp_path / "web.json", "0.0.0.0", 8123)

    assert find(env).url == "http://127.0.0.1:8123"
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
