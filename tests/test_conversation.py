"""A completed chat job's page continues the conversation: each follow-up is a new job carrying the whole history,
which queues, streams and cancels like any; it reads that history from the worker's prefix cache, and the page
shows the whole thread, each answer with the job that gave it and the prompt tokens it read from the cache."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import wait_ended
from tests.test_browser import STREAM_TIMEOUT_MS, submit_form, timings_shown

# long enough that a turn's history is well past the prefix cache's 32-token minimum on the demo model
FIRST = (
    "A queue in front of one GPU: who waits, for how long, and what they are told while they wait. "
    "Describe it in a few words, then tell me what a fair order means for many users."
)
TURNS = ("And then what happens?", "Say it once more, shorter.")


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where the stories save their screenshots: ONELANE_SCREENSHOTS, to look at them, else the test's tmp dir."""
    folder = Path(os.environ.get("ONELANE_SCREENSHOTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def cached(text: str) -> tuple[int, int]:
    """ "46 of 58 prompt tokens" -> (46, 58)."""
    match = re.match(r"(\d+) of (\d+) prompt tokens", text)
    assert match, text
    return int(match.group(1)), int(match.group(2))


def job_id_of(page: Any) -> str:
    return page.url.rsplit("/", 1)[1]


def test_a_three_turn_conversation_streams_each_answer_and_reads_its_history_from_the_cache(
    page, store, start_worker, shots
):
    from playwright.sync_api import expect

    start_worker()
    status, thread = page.locator("#status"), page.locator("#prompt > li")
    ids = [submit_form(page, FIRST, max_tokens="24", ignore_eos=True)]
    expect(status).to_have_attribute("data-status", "completed", timeout=STREAM_TIMEOUT_MS)

    for n, text in enumerate(TURNS, start=1):
        # When the user sends a follow-up from the completed job's page (Enter sends)
        page.fill("#follow-up", text)
        page.press("#follow-up", "Enter")

        # Then a new job takes the page over without leaving it: the answer just given joined the thread, then the
        # new message; the new job streams to its end, and reports the history it read from the prefix cache
        page.wait_for_url(lambda url, seen=ids[-1]: "/jobs/job_" in url and not url.endswith(seen))
        ids.append(job_id_of(page))
        expect(thread).to_have_count(1 + 2 * n)
        expect(thread.last).to_have_text(re.compile(re.escape(text)))
        expect(status).to_have_attribute("data-status", "completed", timeout=STREAM_TIMEOUT_MS)
        from_cache, prompt = cached(timings_shown(page)["From the prefix cache"])
        assert 0 < from_cache < prompt
        assert page.locator("#output").text_content() == wait_ended(store, ids[-1])["output"] != ""
    page.screenshot(path=str(shots / "conversation-live.png"), full_page=True)

    # Each follow-up was a job of its own, whose messages are the history: the turns before, and their answers
    jobs = [store.get(job_id) for job_id in ids]
    assert [len(j.spec.messages or ()) for j in jobs] == [1, 3, 5]
    assert [m.content for m in jobs[2].spec.messages or ()] == [
        FIRST,
        jobs[0].output,
        TURNS[0],
        jobs[1].output,
        TURNS[1],
    ]
    assert jobs[0].usage.cached_tokens == 0 and all(j.usage.cached_tokens > 0 for j in jobs[1:])

    # And the last job's page, opened afresh, shows the same thread, each answer naming its job and its cache reading
    page.reload()
    expect(status).to_have_attribute("data-status", "completed")
    assert [li.get_attribute("data-role") for li in thread.all()] == ["user", "assistant"] * 2 + ["user"]
    metas = page.locator("#prompt .turn-meta")
    assert metas.locator("a").all_text_contents() == ids[:2]
    assert [cached(t)[0] for t in metas.locator(".cached").all_text_contents()] == [
        j.usage.cached_tokens for j in jobs[:2]
    ]
    expect(page.locator("#continue")).to_be_visible()
    page.screenshot(path=str(shots / "conversation-reloaded.png"), full_page=True)


def test_without_the_script_a_follow_up_is_a_form_that_leads_to_the_new_jobs_page(app, store, start_worker):
    start_worker()
    browser = app.test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"', browser.get("/").get_data(as_text=True)).group(1)  # type: ignore[union-attr]
    first = browser.post("/jobs", data={"prompt": FIRST, "max_tokens": "8", "csrf_token": token})
    first_id = first.headers["Location"].rsplit("/", 1)[1]
    done = wait_ended(store, first_id)

    # A follow-up without its page's token changes nothing
    assert browser.post(f"/jobs/{first_id}/continue", data={"prompt": "more"}).status_code == 403
    # An empty one is refused on the page itself, which keeps the form
    empty = browser.post(f"/jobs/{first_id}/continue", data={"prompt": " ", "csrf_token": token})
    assert empty.status_code == 422 and 'id="form-error"' in empty.get_data(as_text=True)

    # When the form is posted, the browser is sent to the new job's page, whose thread holds the whole history
    sent = browser.post(
        f"/jobs/{first_id}/continue", data={"prompt": "more", "csrf_token": token}, headers={"Accept": "text/html"}
    )
    assert sent.status_code == 303
    html = browser.get(sent.headers["Location"]).get_data(as_text=True)
    assert html.count('class="turn"') == 3 and done["output"] in html and f">{first_id}</a>" in html
    second = wait_ended(store, sent.headers["Location"].rsplit("/", 1)[1])
    assert [m["content"] for m in second["messages"]] == [FIRST, done["output"], "more"]

    # And only a completed chat of one's own continues: another browser gets 404
    stranger = app.test_client()
    stranger.get("/")
    with stranger.session_transaction() as session:
        other_token = session["csrf"]
    assert (
        stranger.post(f"/jobs/{first_id}/continue", data={"prompt": "x", "csrf_token": other_token}).status_code == 404
    )
