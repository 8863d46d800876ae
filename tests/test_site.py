"""The site as a browser finds it: a nav on every page reaching the form, /queue and /docs; errors as pages of the site
for a browser and as JSON for everyone else; and, in local mode, why the API's jobs are another user's on /queue."""

from __future__ import annotations

import re

from tests.test_conversation import shots  # noqa: F401  (the fixture)

NAV = ["New job", "My jobs", "Queue", "API docs"]


def test_the_nav_reaches_the_form_the_queue_and_the_docs(page, shots):  # noqa: F811
    from playwright.sync_api import expect

    page.goto("/")
    nav = page.locator("header.site nav a")
    assert nav.all_text_contents() == NAV
    page.click("header.site nav >> text=Queue")
    expect(page.locator("h1")).to_have_text("Queue")
    assert page.url.endswith("/queue")
    expect(page.locator("header.site nav a[aria-current=page]")).to_have_text("Queue")
    page.click("header.site nav >> text=API docs")
    expect(page.locator("h1")).to_contain_text("API")
    assert page.url.endswith("/docs") and nav.all_text_contents() == NAV
    page.screenshot(path=str(shots / "nav-docs.png"))
    page.click("header.site nav >> text=New job")
    expect(page.locator("h1")).to_have_text("New job")


def test_the_nav_stands_in_the_same_place_on_every_page(chromium, live_server, shots):  # noqa: F811
    import os

    from tests.conftest import CHROMIUM, CHROMIUM_ARGS

    # Given a browser that draws scrollbars as a desktop one does (headless Chromium hides them by default), so that
    # a page long enough to scroll is narrower than one that is not
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    desktop = chromium.browser_type.launch(
        executable_path=CHROMIUM, args=CHROMIUM_ARGS, env=env, ignore_default_args=["--hide-scrollbars"]
    )
    try:
        for width in (1280, 800):
            page = desktop.new_context(base_url=live_server, viewport={"width": width, "height": 700}).new_page()
            # When the form (long: it scrolls), the job list (short), the queue (wide) and the docs are opened
            places = {}
            for path in ("/", "/jobs", "/queue", "/docs"):
                page.goto(path)
                places[path] = page.eval_on_selector_all(
                    "header.site a",
                    "links => links.map(a => { const r = a.getBoundingClientRect(); "
                    "return [a.textContent, r.x, r.y, r.width, r.height]; })",
                )
                page.screenshot(path=str(shots / f"nav-{width}{path.replace('/', '-')}.png"))
            # Then the brand and every link of the nav stand in the same place, at the same size, on each
            assert places["/"][1:] and [text for text, *_ in places["/"]] == ["onelane", *NAV]
            for path, links in places.items():
                assert links == places["/"], f"{width} px: the nav on {path} is not where it is on /"
            page.context.close()
    finally:
        desktop.close()


def test_an_unknown_url_gives_a_browser_a_page_of_the_site(page, shots):  # noqa: F811
    from playwright.sync_api import expect

    answer = page.goto("/no/such/page")
    assert answer.status == 404 and answer.headers["content-type"].startswith("text/html")
    expect(page.locator("h1")).to_have_text("Page not found")
    assert page.locator("header.site nav a").all_text_contents() == NAV
    page.screenshot(path=str(shots / "not-found.png"))
    page.click("main >> text=the queue")
    expect(page.locator("h1")).to_have_text("Queue")


def test_an_api_client_still_gets_json_for_any_error(app):
    client = app.test_client()
    for accept in (None, "*/*", "application/json", "text/html, application/json"):
        headers = {"Accept": accept} if accept else {}
        missing = client.get("/no/such/page", headers=headers)
        assert missing.status_code == 404 and missing.get_json()["error"]["type"] == "not_found", accept
        assert "Accept" in missing.headers["Vary"]
    # a wrong method, and an SSE client, keep their JSON
    wrong = client.get("/v1/chat/completions", headers={"Accept": "application/json"})
    assert wrong.status_code == 405 and wrong.get_json()["error"]["type"] == "method_not_allowed"
    assert client.get("/v1/jobs/job_nope/events", headers={"Accept": "text/event-stream"}).is_json


def test_a_browser_gets_other_errors_as_pages_with_no_internals(app):
    def boom() -> None:
        raise RuntimeError("secret internals")

    app.add_url_rule("/boom", "boom", boom)
    browser = app.test_client()
    html = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}

    not_allowed = browser.delete("/", headers=html)
    assert not_allowed.status_code == 405 and "Method Not Allowed" in not_allowed.get_data(as_text=True)
    failed = browser.get("/boom", headers=html)
    text = failed.get_data(as_text=True)
    assert failed.status_code == 500 and "internal error; it has been logged" in text and "secret" not in text
    assert failed.headers["Content-Security-Policy"].startswith("default-src 'self'")
    no_job = browser.get("/v1/jobs/job_nope", headers=html)
    assert no_job.status_code == 404 and 'id="error"' in no_job.get_data(as_text=True)


def test_in_local_mode_the_queue_says_why_the_apis_jobs_are_another_users(page, jobs, shots):  # noqa: F811
    from playwright.sync_api import expect

    # Given a job sent through the API from this machine (no worker: it waits), and one from the browser's form
    jobs.submit("from curl", max_tokens=8)
    page.goto("/")
    page.fill("#prompt", "from the browser")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/jobs/job_"))

    # When the browser opens the queue
    page.click("header.site nav >> text=Queue")

    # Then its own job is named, the API's is counted as another user's, and the page says why
    expect(page.locator("#waiting table.board tbody tr")).to_have_count(1)
    expect(page.locator("#waiting-others")).to_have_text("1 other user: 1 job")
    note = page.locator("#local-api")
    expect(note).to_contain_text('belong to one user, "local", and count here as another user\'s: 1 job waiting')
    expect(note).to_contain_text("so its prompts stay private from other browsers and from API clients")
    page.screenshot(path=str(shots / "queue-local-mode.png"), full_page=True)


def test_with_keys_the_queue_has_no_local_mode_note(make_app, settings):
    from tasks.users import User

    app = make_app(settings.model_copy(update={"users": (User(name="ann", key="k-ann-123456"),)}))
    seen = app.test_client().get("/queue.json", headers={"Authorization": "Bearer k-ann-123456"}).get_json()
    assert seen["local_api"] is None


def test_the_login_field_is_styled_as_the_form_fields(make_app, settings, chromium, shots):  # noqa: F811
    import threading

    from werkzeug.serving import make_server

    from tasks.users import User

    app = make_app(settings.model_copy(update={"users": (User(name="ann", key="k-ann-123456"),)}))
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    context = chromium.new_context(base_url=f"http://127.0.0.1:{server.server_port}")
    try:
        page = context.new_page()
        page.goto("/queue")  # signed out: sent to sign in
        key = page.locator("#key")
        style = key.evaluate("e => [getComputedStyle(e).borderRadius, getComputedStyle(e).width]")
        form_width = page.locator("form.submit").evaluate("e => getComputedStyle(e).width")
        assert style == ["6px", form_width]
        page.screenshot(path=str(shots / "login.png"))
    finally:
        context.close()
        server.shutdown()
