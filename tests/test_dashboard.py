"""The queue dashboard: who sees what, admins cancel anything, live batches, workers and plots; in real Chromium."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tasks import keys
from tasks.errors import SettingsError
from tasks.job import JobStatus
from tasks.settings import Settings
from tasks.store import Store
from tasks.users import User
from tests.helpers import BUSY, claim_now, wait_ended, wait_event
from tests.test_browser import STREAM_TIMEOUT_MS

USERS = (
    User(name="alice", key="ka"),
    User(name="bob", key="kb"),
    User(name="carol", key="kc"),
    User(name="root", key="kr", admin=True),
)
SECRET = "alice's secret prompt"


def auth(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer k{user[0]}"}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"users": USERS})


def submit(client, user: str, prompt: str, **fields: Any) -> str:  # type: ignore[no-untyped-def]
    response = client.post("/v1/jobs", json={"prompt": prompt, "max_tokens": 4, **fields}, headers=auth(user))
    assert response.status_code == 202, response.get_json()
    return str(response.get_json()["id"])


def board(client, user: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    response = client.get("/queue.json", headers=auth(user))
    assert response.status_code == 200, response.get_json()
    return response.get_json()  # type: ignore[no-any-return]


def run_by_hand(store: Store, job_id: str, tokens: int, status: JobStatus = JobStatus.COMPLETED) -> None:
    """Play the worker for one job (no model needed): claim it, generate `tokens`, end it."""
    assert store.for_worker("w").take_device() == "ok"
    assert claim_now(store, "w").id == job_id
    store.for_worker("w").append(job_id, (7,) * tokens, "x" * tokens, 1)
    store.for_worker("w").finish(job_id, status, finish_reason="length", prompt_tokens=1, completion_tokens=tokens)


# --- who sees what -----------------------------------------------------------------------------------------------


def test_a_user_sees_their_own_jobs_named_and_others_only_counted(jobs):
    c = jobs.client
    secret = [submit(c, "alice", SECRET) for _ in range(2)]
    carol = [submit(c, "carol", "carol's prompt") for _ in range(3)]
    mine = submit(c, "bob", "bob's own prompt")

    seen = board(c, "bob")

    text = json.dumps(seen)
    assert SECRET not in text and "carol's prompt" not in text
    assert not any(job_id in text for job_id in [*secret, *carol]) and "alice" not in text and "carol" not in text
    assert [(j["id"], j["prompt"], j["position"]) for j in seen["waiting"]["jobs"]] == [(mine, "bob's own prompt", 3)]
    assert seen["waiting"]["others"] == [2, 3]  # two other users, in the order their first job waits
    assert seen["waiting"]["total"] == 6 and seen["viewer"] == {"name": "bob", "admin": False}
    assert all(j["owner"] is None for j in seen["waiting"]["jobs"])


def test_an_admin_sees_every_job_named_with_its_owner(jobs):
    c = jobs.client
    ids = [submit(c, "alice", SECRET), submit(c, "bob", "bob's prompt")]

    seen = board(c, "root")

    assert seen["viewer"]["admin"] is True and seen["waiting"]["others"] == []
    assert [(j["id"], j["owner"], j["prompt"]) for j in seen["waiting"]["jobs"]] == [
        (ids[0], "alice", SECRET),
        (ids[1], "bob", "bob's prompt"),
    ]
    assert all(j["cancel_url"] for j in seen["waiting"]["jobs"])


def make_batch(client, user: str, model: str, lines: int, bad: int = 0) -> str:  # type: ignore[no-untyped-def]
    """A batch of `lines` chat requests, `bad` of them for an unknown url, created by `user` (no worker runs it)."""
    import io

    def line(n: int) -> str:
        url = "/v1/nope" if n < bad else "/v1/chat/completions"
        return json.dumps(
            {
                "custom_id": f"r{n}",
                "method": "POST",
                "url": url,
                "body": {"model": model, "messages": [{"role": "user", "content": SECRET}], "max_tokens": 2},
            }
        )

    data = "".join(line(n) + "\n" for n in range(lines)).encode()
    sent = client.post(
        "/v1/files", data={"purpose": "batch", "file": (io.BytesIO(data), "b.jsonl")}, headers=auth(user)
    )
    body = {"input_file_id": sent.get_json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    return str(client.post("/v1/batches", json=body, headers=auth(user)).get_json()["id"])


def test_batches_show_with_their_counts_to_their_owner_and_only_counted_to_others(jobs, settings):
    c = jobs.client
    mine = make_batch(c, "alice", settings.model_name, 4, bad=1)

    assert [
        (b["id"], b["status"], b["total"], b["completed"], b["failed"], b["owner"])
        for b in board(c, "alice")["batches"]["batches"]
    ] == [(mine, "in_progress", 4, 0, 1, None)]
    seen = board(c, "bob")
    assert seen["batches"] == {"batches": [], "others": {"batches": 1, "users": 1}} and mine not in json.dumps(seen)
    assert [b["owner"] for b in board(c, "root")["batches"]["batches"]] == ["alice"]


def test_an_admin_cancels_another_users_job_and_its_owner_is_told(jobs, store):
    c = jobs.client
    job_id = submit(c, "alice", SECRET)

    assert c.post(f"/queue/jobs/{job_id}/cancel", headers=auth("bob")).status_code == 404  # not bob's
    assert c.post("/queue/jobs/job_nope/cancel", headers=auth("root")).status_code == 404
    response = c.post(f"/queue/jobs/{job_id}/cancel", headers=auth("root"))

    assert response.status_code == 200 and response.get_json() == {"id": job_id, "status": "cancelled"}
    job = c.get(f"/v1/jobs/{job_id}", headers=auth("alice")).get_json()
    assert job["status"] == "cancelled" and job["error"]["type"] == "cancelled_by_admin"
    assert "root" in job["error"]["message"]


def test_a_user_cancels_their_own_job_from_the_dashboard(jobs):
    c = jobs.client
    job_id = submit(c, "bob", "mine")

    assert c.post(f"/queue/jobs/{job_id}/cancel", headers=auth("bob")).get_json()["status"] == "cancelled"
    assert c.get(f"/v1/jobs/{job_id}", headers=auth("bob")).get_json()["error"] is None


def test_the_dashboard_needs_a_signed_in_user_and_the_cancel_its_csrf_token(jobs, app):
    c = jobs.client
    job_id = submit(c, "alice", SECRET)
    browser = app.test_client()

    assert browser.get("/queue").status_code == 303  # to /login
    assert browser.get("/queue.json").status_code == 401
    browser.get("/login")
    with browser.session_transaction() as session:
        token = session["csrf"]
    assert browser.post("/login", data={"key": "kr", "csrf_token": token}).status_code == 303
    with browser.session_transaction() as session:
        token = session["csrf"]
    page = browser.get("/queue")
    assert page.status_code == 200 and page.headers["Content-Security-Policy"].startswith("default-src 'self'")

    assert browser.post(f"/queue/jobs/{job_id}/cancel").status_code == 403  # no token
    assert browser.post(f"/queue/jobs/{job_id}/cancel", headers={"X-CSRF-Token": token}).status_code == 200


def test_in_local_mode_nobody_is_an_admin(make_app, settings):
    client = make_app(settings.model_copy(update={"users": ()})).test_client()
    client.post("/v1/jobs", json={"prompt": "the local user's prompt"})  # the API's local user

    html = client.get("/queue").get_data(as_text=True)  # a browser visitor
    seen = client.get("/queue.json").get_json()

    assert seen["viewer"]["admin"] is False and seen["viewer"]["name"].startswith("web-")
    assert seen["waiting"]["others"] == [1] and "the local user" not in html + json.dumps(seen)


def test_admin_comes_from_a_toml_boolean_in_the_keys_file(tmp_path):
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text('[users.root]\nkey = "kr"\nadmin = true\n[users.ann]\nkey = "ka"\n')
    users = Settings.from_env({"ONELANE_API_KEYS_FILE": str(keys_file)}).users
    assert [(u.name, u.admin) for u in users] == [("root", True), ("ann", False)]

    keys_file.write_text('[users.root]\nkey = "kr"\nadmin = "yes"\n')
    with pytest.raises(SettingsError, match=r"users\.root\.admin"):
        Settings.from_env({"ONELANE_API_KEYS_FILE": str(keys_file)})


# --- what the scripts record for it ------------------------------------------------------------------------------


def test_minutes_count_tokens_ends_and_waits_and_every_record_is_bounded(jobs, store):
    c = jobs.client
    done = submit(c, "alice", "a")
    failed = submit(c, "bob", "b")
    run_by_hand(store, done, 5)
    run_by_hand(store, failed, 2, JobStatus.FAILED)

    minutes = board(c, "root")["minutes"]

    assert [m["t"] for m in minutes] == [minutes[0]["t"] + 60 * n for n in range(60)]
    assert sum(m["tokens"] for m in minutes) == 7 and sum(m["admitted"] for m in minutes) == 2
    assert sum(m["completed"] for m in minutes) == 1 and sum(m["failed"] for m in minutes) == 1
    assert sum(m["started"] for m in minutes) == 2 and max(m["wait_max_s"] or 0 for m in minutes) >= 0
    recorded = store.redis.keys(keys.MINUTE_PREFIX + "*")
    assert recorded and all(0 < store.redis.ttl(k) <= keys.MINUTE_TTL_S for k in recorded)
    assert store.redis.lrange(keys.FAILURES, 0, -1) == [failed]
    assert 0 < store.redis.ttl(keys.FAILURES) <= store.settings.result_ttl_s


def test_a_token_written_after_the_lease_lapsed_leaves_no_lease_record_and_the_device_shows_down(jobs, store):
    c = jobs.client
    job_id = submit(c, "alice", "a")
    assert store.for_worker("w").take_device() == "ok"
    assert claim_now(store, "w").id == job_id
    store.redis.delete(keys.device(store.settings.device))  # the worker froze past its lease, then writes

    store.for_worker("w").append(job_id, (7,), "x", 1)

    assert not store.redis.exists(keys.device(store.settings.device))  # not recreated without its TTL
    assert board(c, "root")["workers"] == [{"device": store.settings.device, "health": "down", "state": "bad"}]


def test_recent_failures_keep_the_newest_50_and_hide_whose_they_are(jobs, store):
    c = jobs.client
    ids = [submit(c, ("alice", "carol")[n % 2], SECRET, ttl_s=0.01) for n in range(keys.FAILURES_KEPT + 3)]
    for job_id in ids:  # the web's housekeeping expires them within a second
        assert wait_ended(store, job_id)["status"] == "expired"

    assert store.redis.lrange(keys.FAILURES, 0, -1) == ids[::-1][: keys.FAILURES_KEPT]
    failures = board(c, "bob")["failures"]
    assert len(failures) == keys.FAILURES_KEPT
    newest = failures[0]
    assert newest == {
        "status": "expired",
        "error": "expired",
        "at": newest["at"],
        "model": newest["model"],
        "mine": False,
    }
    assert SECRET not in json.dumps(failures)
    assert board(c, "alice")["failures"][0]["prompt"] == SECRET


# --- in a real browser -------------------------------------------------------------------------------------------


def sign_in(page: Any, key: str) -> None:  # noqa: F811 (a page, not the fixture)
    page.goto("/login")
    page.fill("#key", key)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/$"))


def script_errors(page: Any) -> list[str]:
    """The script errors (a CSP violation too) and failed requests `page` logs from now on (but the favicon's 404)."""
    errors: list[str] = []

    def on_console(message: Any) -> None:
        if message.type == "error" and not message.location.get("url", "").endswith("/favicon.ico"):
            errors.append(message.text)

    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", on_console)
    return errors


@pytest.fixture
def strict_page(page):  # type: ignore[no-untyped-def]  # noqa: F811
    """test_browser's page; the test fails if the page logs a script error."""
    errors = script_errors(page)
    yield page
    assert errors == []


@pytest.fixture
def second_page(chromium, live_server):  # type: ignore[no-untyped-def]  # noqa: F811
    """Another browser profile (another signed-in user); the test fails if it logs a script error."""
    context = chromium.new_context(base_url=live_server)
    page = context.new_page()
    errors = script_errors(page)
    yield page
    context.close()
    assert errors == []


def test_in_the_browser_an_admin_cancels_another_users_job_and_a_user_sees_only_counts(
    strict_page, second_page, jobs, store
):
    from playwright.sync_api import expect

    page = strict_page
    c = jobs.client
    secret = submit(c, "alice", SECRET)
    submit(c, "carol", "carol's prompt")
    submit(c, "carol", "carol's other prompt")
    own = submit(c, "bob", "bob's own prompt")
    sign_in(page, "kr")
    sign_in(second_page, "kb")

    page.goto("/queue")
    admin_rows = page.locator("#waiting tbody tr")
    expect(admin_rows).to_have_count(4)
    expect(admin_rows.first).to_contain_text(SECRET)
    expect(admin_rows.first).to_contain_text("alice")
    second_page.goto("/queue")
    user_rows = second_page.locator("#waiting tbody tr")
    expect(user_rows).to_have_count(1)
    expect(user_rows).to_contain_text("bob's own prompt")
    expect(second_page.locator("#waiting-others")).to_have_text("2 other users: 1, 2 jobs")
    seen = second_page.content() + json.dumps(second_page.evaluate("() => fetch('/queue.json').then(r => r.json())"))
    assert SECRET not in seen and "carol" not in seen and secret not in seen and own in seen

    admin_rows.first.get_by_role("button", name="Cancel").click()
    page.mouse.move(0, 0)  # (the rows hold still while the pointer is on them: the next story)

    expect(admin_rows).to_have_count(3)
    assert store.get(secret).status is JobStatus.CANCELLED
    expect(user_rows).to_have_count(1)  # bob's page follows by itself: one other user left, with 2 jobs
    expect(second_page.locator("#waiting-others")).to_have_text("1 other user: 2 jobs", timeout=STREAM_TIMEOUT_MS)
    assert page.dialogs == []


def test_in_the_browser_the_rows_hold_still_under_the_pointer_and_a_cancel_ends_the_job_it_was_aimed_at(
    strict_page, jobs, store
):
    from playwright.sync_api import expect

    page = strict_page
    c = jobs.client
    above = submit(c, "alice", "alice's prompt")
    aimed = submit(c, "carol", "carol's prompt")
    sign_in(page, "kr")
    page.goto("/queue")
    rows = page.locator("#waiting tbody tr")
    expect(rows).to_have_count(2)
    button = rows.nth(1).get_by_role("button", name="Cancel")
    button.hover()
    box = button.bounding_box()
    assert box is not None

    # the job above ends; drawn again, the aimed-at job's row would move up under the pointer, the next one's in
    assert c.delete(f"/v1/jobs/{above}", headers=auth("alice")).status_code == 200
    expect(page.locator("#updated")).to_contain_text("Held while you point at a job", timeout=STREAM_TIMEOUT_MS)
    expect(rows).to_have_count(2)
    assert button.bounding_box() == box
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)  # where the user aimed

    expect(button).to_have_text("Cancelled")
    assert store.get(aimed).status is JobStatus.CANCELLED
    page.mouse.move(0, 0)
    expect(page.locator("#waiting")).to_have_text("Nothing waits.")
    expect(page.locator("#updated")).to_contain_text("Live")


def test_in_the_browser_the_running_batch_workers_and_plots_show_live(strict_page, jobs, store, start_worker):
    from playwright.sync_api import expect

    page = strict_page
    c = jobs.client
    start_worker()
    for n in range(3):
        wait_ended(store, submit(c, "alice", f"short {n}", max_tokens=8, ignore_eos=True))
    long = submit(c, "bob", "keep the GPU busy", max_tokens=BUSY, ignore_eos=True)
    wait_event(store, long, lambda e: e.type == "token")
    sign_in(page, "kb")

    page.goto("/queue")

    running = page.locator("#running tbody tr")
    expect(running).to_have_count(1)
    expect(running).to_contain_text("keep the GPU busy")
    expect(page.locator("#occupancy-text")).to_have_text("1 of 1 slot busy (100%)")
    expect(page.locator("#workers tbody tr")).to_contain_text("generating")
    expect(page.locator("#plot-jobs")).to_have_attribute("data-total", "3")
    expect(page.locator("#caption-jobs")).to_contain_text("3 completed")
    expect(page.locator("#caption-wait")).to_contain_text("4 jobs started")
    assert int(page.locator("#plot-tokens").get_attribute("data-total")) >= 24
    tokens = running.locator("td").nth(2)  # the count moves on as the page polls
    before = tokens.text_content()
    expect(tokens).not_to_have_text(before, timeout=STREAM_TIMEOUT_MS)

    running.get_by_role("button", name="Cancel").click()
    page.mouse.move(0, 0)  # (its row holds still until the pointer leaves)

    expect(page.locator("#running")).to_contain_text("Nothing runs.", timeout=STREAM_TIMEOUT_MS)
    assert wait_ended(store, long)["status"] == "cancelled"
    expect(page.locator("#workers tbody tr")).to_contain_text("idle", timeout=STREAM_TIMEOUT_MS)


def test_in_the_browser_a_user_sees_their_batch_with_its_counts_and_others_only_counted(
    strict_page, second_page, jobs, settings
):
    from playwright.sync_api import expect

    mine = make_batch(jobs.client, "bob", settings.model_name, 5, bad=2)
    make_batch(jobs.client, "carol", settings.model_name, 3)
    sign_in(strict_page, "kb")
    sign_in(second_page, "kr")

    strict_page.goto("/queue")
    rows = strict_page.locator("#batches tbody tr")
    expect(rows).to_have_count(1)
    expect(rows).to_contain_text(mine)
    expect(rows).to_contain_text("2 / 5")  # 2 lines ended (refused at once), of 5
    expect(strict_page.locator("#batches-others")).to_have_text("+ 1 batch of 1 other user")
    second_page.goto("/queue")
    expect(second_page.locator("#batches tbody tr")).to_have_count(2)  # an admin sees both, with their owners
    expect(second_page.locator("#batches")).to_contain_text("carol")
    assert strict_page.dialogs == []
