"""The pages in a real headless Chromium: waiting, streaming, cancelling, and markup that stays text."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.helpers import BUSY, claim_now, wait_event
from web.responses import Job as JobBody

XSS = "<script>alert(1)</script> <img src=x onerror=alert(1)>"
STREAM_TIMEOUT_MS = 30_000

# Snapshots of (status, output) after every change to the job page, to see what a reader saw as it streamed.
RECORD_CHANGES = """() => {
  window.seen = [];
  const status = document.getElementById("status");
  const output = document.getElementById("output");
  new MutationObserver(() => window.seen.push([status.dataset.status, output.textContent]))
    .observe(document.getElementById("job"), {subtree: true, childList: true, characterData: true, attributes: true});
}"""


def submit_form(page: Any, prompt: str, max_tokens: str = "64", ignore_eos: bool = False, raw: bool = False) -> str:
    """Fill in and send the form (the prompt as a chat turn, or with `raw` as text to continue); return the id of the
    job whose page it lands on."""
    page.goto("/")
    page.fill("#prompt", prompt)
    page.fill("#max_tokens", max_tokens)
    if ignore_eos:
        page.check("#ignore_eos")
    if raw:
        page.check("#raw")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/jobs/job_[\w-]+$"))
    return page.url.rsplit("/", 1)[1]


def seconds(text: str) -> float:
    """A duration as the page writes it ("0.42 s", "2 min 5 s") in seconds."""
    match = re.fullmatch(r"(?:(\d+) min )?([\d.]+) s", text)
    assert match, text
    return int(match.group(1) or 0) * 60 + float(match.group(2))


def timings_shown(page: Any) -> dict[str, str]:
    labels = page.locator("#timings dt").all_text_contents()
    return dict(zip(labels, page.locator("#timings dd").all_text_contents(), strict=True))


def start_long_job(jobs, store) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """A job that keeps the worker busy until it is cancelled, once it produced its first token."""
    job = jobs.submit("keep the GPU busy", max_tokens=BUSY, ignore_eos=True)
    wait_event(store, job["id"], lambda e: e.type == "token")
    return job


def test_a_job_waits_its_turn_then_streams_and_ends_with_timings(page, jobs, store, start_worker):
    from playwright.sync_api import expect

    start_worker()
    long = start_long_job(jobs, store)

    job_id = submit_form(page, "tell me a story", max_tokens="200", ignore_eos=True, raw=True)
    status = page.locator("#status")
    expect(status).to_have_text(re.compile(r"^#1 in queue, about \d+ min \d+ s$"))  # the long job's tokens left
    expect(page.locator("#cancel")).to_be_visible()
    page.evaluate(RECORD_CHANGES)
    jobs.cancel(long["id"])

    expect(status).to_have_attribute("data-status", "completed", timeout=STREAM_TIMEOUT_MS)
    expect(status).to_have_text("Completed: reached the limit of 200 tokens.")
    expect(page.locator("#cancel")).to_have_count(0)
    done = JobBody.of(store.get(job_id))
    final = page.locator("#output").text_content()
    assert final == done["output"] and final
    streaming = [text for state, text in page.evaluate("window.seen") if state == "in_progress"]
    assert any(0 < len(text) < len(final) for text in streaming), "the output never showed part-way"
    assert all(final.startswith(text) for text in streaming), "the streamed text diverged from the output"

    shown = timings_shown(page)
    t = done["timings"]
    assert list(shown) == ["Waited in queue", "Time to first token", "Total", "Tokens", "Speed"]
    assert seconds(shown["Waited in queue"]) == pytest.approx(t["started_at"] - t["queued_at"], abs=0.01)
    assert seconds(shown["Time to first token"]) == pytest.approx(t["first_token_at"] - t["queued_at"], abs=0.01)
    assert seconds(shown["Total"]) == pytest.approx(t["finished_at"] - t["queued_at"], abs=0.1)
    assert shown["Tokens"] == "200"
    speed = 200 / (t["finished_at"] - t["first_token_at"])
    assert float(shown["Speed"].removesuffix(" tokens/s")) == pytest.approx(speed, abs=0.051)


def test_the_cancel_button_cancels_a_waiting_job(page, store):
    from playwright.sync_api import expect

    job_id = submit_form(page, "never mind")  # no worker: it waits
    expect(page.locator("#status")).to_have_text("#1 in queue, ETA unknown")

    page.click("#cancel")

    expect(page.locator("#status")).to_have_text("Cancelled before it started.")
    expect(page.locator("#status")).to_have_attribute("data-status", "cancelled")
    expect(page.locator("#cancel")).to_have_count(0)
    assert store.get(job_id).status.value == "cancelled"
    shown = timings_shown(page)
    assert list(shown) == ["Total", "Tokens"] and shown["Tokens"] == "0"


def test_a_job_skipped_because_its_page_was_left_says_so(page, store):
    from playwright.sync_api import expect

    job_id = submit_form(page, "left behind")
    expect(page.locator("#status")).to_have_text("#1 in queue, ETA unknown")

    # how the worker ends a watched job whose page was closed (the lease itself is tested in test_stream.py)
    store.cancel(job_id, store.get(job_id).owner, error=("client_gone", "the client left before the job started"))

    expect(page.locator("#status")).to_have_text("Cancelled: you left the page before it started.")
    expect(page.locator("#cancel")).to_have_count(0)


CANCEL_BOX = "() => JSON.stringify(document.getElementById('cancel').getBoundingClientRect())"


def test_the_cancel_button_holds_still_as_the_answer_streams_and_stops_the_job_keeping_its_output(
    page, store, start_worker
):
    from playwright.sync_api import expect

    start_worker()
    job_id = submit_form(page, "go on and on", max_tokens="4000", ignore_eos=True)
    # the answer grows by lines below the question (a chat's answer is its turn of the thread): a button below it
    # would move as the user reaches for it, and a click could land on the text instead (measured as the page opens,
    # its output a few lines at most, far from its most height)
    box, height = page.evaluate(CANCEL_BOX), page.locator("#output").evaluate("e => e.offsetHeight")
    page.wait_for_function(  # a function, not a string: the page's CSP forbids eval
        "() => document.getElementById('status').dataset.status === 'in_progress'"
        f" && document.getElementById('output').offsetHeight > {height} + 60",
        timeout=STREAM_TIMEOUT_MS,
    )
    assert page.evaluate(CANCEL_BOX) == box

    page.click("#cancel")

    # (within the stream's bound, not the 5 s default: on a loaded machine the page reads the demo model's hundreds
    # of tokens a second behind the worker, and the in-process worker shares its interpreter with the web)
    expect(page.locator("#status")).to_have_text(
        "Cancelled while running; the output so far is kept.", timeout=STREAM_TIMEOUT_MS
    )
    expect(page.locator("#cancel")).to_have_count(0)
    job = JobBody.of(store.get(job_id))
    assert job["status"] == "cancelled" and job["finish_reason"] == "cancelled"
    assert page.locator("#output").text_content() == job["output"] != ""
    assert 0 < job["usage"]["completion_tokens"] < 4000


def test_a_job_the_worker_dropped_goes_on_where_it_was(page, store):
    from playwright.sync_api import expect

    from tasks.job import JobStatus

    job_id = submit_form(page, "again")  # no worker: this test plays the worker, step by step
    status, output = page.locator("#status"), page.locator("#output")
    expect(status).to_have_text("#1 in queue, ETA unknown")
    assert store.for_worker("w").take_device() == "ok"
    assert claim_now(store, "w").id == job_id
    store.for_worker("w").append(job_id, (7, 7), "kept text", 1)
    expect(output).to_have_text("kept text")

    store.for_worker("w").hand_back(job_id)  # as after the worker died mid-run: back to the front, output kept

    # (its place may be told again before it starts; the reason stays with it)
    expect(status).to_contain_text("the worker stopped; it will go on where it was")
    expect(output).to_have_text("kept text")
    store.keep_watching(store.get(job_id))  # the page's lease is the stream's business, not this test's
    assert (
        store.for_worker("w").take_device() == "ok"
    )  # renew the lease this test holds as the worker (no heartbeat here)
    assert claim_now(store, "w").id == job_id
    store.for_worker("w").append(job_id, (7,), ", and more", 1)
    store.for_worker("w").finish(
        job_id, JobStatus.COMPLETED, finish_reason="stop", prompt_tokens=1, completion_tokens=3
    )
    expect(status).to_have_text("Completed: the model finished.")
    assert output.text_content() == "kept text, and more" == store.get(job_id).output


def test_markup_in_a_prompt_renders_as_text_and_runs_nothing(page):
    from playwright.sync_api import expect

    page.evaluate("alert('the dialog listener works')")  # control: a dialog that does fire is seen
    submit_form(page, XSS)  # a chat turn
    expect(page.locator("#status")).to_have_text("#1 in queue, ETA unknown")  # the page's script ran
    assert page.locator("#prompt pre").all_text_contents() == [XSS]
    assert page.locator("#prompt img, #prompt script").count() == 0
    submit_form(page, XSS, raw=True)  # text to continue
    assert page.locator("#prompt").text_content() == XSS
    assert page.locator("#prompt *").count() == 0
    page.goto("/jobs")
    assert page.locator("table.jobs a").all_text_contents() == [XSS, XSS]
    assert page.locator("table.jobs img, table.jobs script").count() == 0
    assert page.dialogs == ["the dialog listener works"]
