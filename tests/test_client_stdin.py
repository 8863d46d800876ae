"""`onelane run -` reads its prompt from stdin as a file holds it: the line break that ends the file is no part of the
prompt (it changes the answer), the text inside it is kept as it is."""

from __future__ import annotations

from tests.test_client import job_id_in, onelane


def test_a_prompt_read_from_stdin_loses_its_trailing_line_breaks_only(jobs, start_worker, live_server):
    start_worker()

    done = onelane(live_server, "run", "-", "--max-tokens", "1", stdin="  Two lines:\n\n\tthe second \r\n\n")

    assert done.returncode == 0, done.stderr
    assert jobs.get(job_id_in(done.stderr))["messages"] == [
        {"role": "user", "content": "  Two lines:\n\n\tthe second "}
    ]
