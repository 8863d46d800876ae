"""The server-rendered pages: the form admits through the API's checks, and untrusted text stays text."""

from __future__ import annotations

import re

import pytest

from tasks import keys

XSS = "<script>alert(1)</script> <img src=x onerror=alert(1)>"
XSS_ESCAPED = ("&lt;script&gt;alert(1)&lt;/script&gt;", "&lt;img src=x onerror=alert(1)&gt;")


@pytest.fixture
def browser(app):  # type: ignore[no-untyped-def]
    """A test client that, like a browser, keeps its session cookie."""
    return app.test_client()


def form_token(client) -> str:  # type: ignore[no-untyped-def]
    """Open the form as a browser would and return its CSRF token."""
    html = client.get("/").get_data(as_text=True)
    return re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)  # type: ignore[union-attr]


def post_form(client, **fields: str):  # type: ignore[no-untyped-def]
    return client.post("/jobs", data={"csrf_token": form_token(client), **fields})


def submit_via_form(client, prompt: str, **fields: str) -> str:  # type: ignore[no-untyped-def]
    """Submit through the form; return the new job's id."""
    response = post_form(client, prompt=prompt, **fields)
    assert response.status_code == 303, response.get_data(as_text=True)
    match = re.fullmatch(r"/jobs/(job_[\w-]+)", response.headers["Location"])
    assert match, response.headers["Location"]
    return match.group(1)


def test_the_form_page_has_the_fields_and_defaults(browser):
    html = browser.get("/").get_data(as_text=True)

    assert '<textarea id="prompt" name="prompt"' in html
    assert re.search(r'name="max_tokens"[^>]*value="64"', html)
    assert re.search(r'name="temperature"[^>]*value="0"', html)


def test_form_submit_redirects_to_the_job_page_and_the_job_is_watched(browser):
    job_id = submit_via_form(browser, "hello there", max_tokens="8", temperature="0.5")

    job = browser.get(f"/v1/jobs/{job_id}").get_json()
    assert job["abandon_on_disconnect"] is True
    assert job["prompt"] == "hello there"
    assert job["params"]["max_tokens"] == 8 and job["params"]["temperature"] == 0.5
    assert job["params"]["ignore_eos"] is False
    page = browser.get(f"/jobs/{job_id}")
    assert page.status_code == 200 and page.mimetype == "text/html"
    assert "hello there" in page.get_data(as_text=True)


def test_empty_number_fields_take_the_server_defaults_and_the_box_sets_ignore_eos(browser, settings):
    job_id = submit_via_form(browser, "defaults", max_tokens="", temperature="", ignore_eos="true")

    job = browser.get(f"/v1/jobs/{job_id}").get_json()
    assert job["params"]["max_tokens"] == settings.default_max_tokens
    assert job["params"]["temperature"] == 0.0
    assert job["params"]["ignore_eos"] is True


REJECTED = [
    ("max tokens zero", {"max_tokens": "0"}, 422, "max_tokens"),
    ("max tokens above the limit", {"max_tokens": "4097"}, 422, "max_tokens may be at most 4096"),
    ("max tokens not a whole number", {"max_tokens": "1.5"}, 422, "max_tokens"),
    ("temperature too high", {"temperature": "5"}, 422, "temperature"),
    ("temperature not a number", {"temperature": "warm"}, 422, "temperature"),
    ("prompt too large", {"prompt": "x" * 32_001}, 413, "this server accepts at most 32000"),
]


@pytest.mark.parametrize("name,fields,status,message", REJECTED, ids=[r[0] for r in REJECTED])
def test_a_rejected_submission_shows_the_form_again_with_the_input_and_the_message(
    browser, store, name, fields, status, message
):
    typed = {"prompt": "keep <my> words", "max_tokens": "16", "temperature": "0.7", **fields}

    response = post_form(browser, **typed)

    html = response.get_data(as_text=True)
    assert response.status_code == status
    assert response.mimetype == "text/html"
    alert = re.search(r'<p class="alert"[^>]*>(.*?)</p>', html, re.S)
    assert alert and message in alert.group(1)
    prompt = typed["prompt"].replace("<", "&lt;").replace(">", "&gt;")
    assert f">{prompt}</textarea>" in html
    for field in ("max_tokens", "temperature"):
        assert re.search(rf'name="{field}"[^>]*value="{re.escape(typed[field])}"', html)
    assert store.redis.keys(keys.JOB_PREFIX + "*") == []


def test_a_body_larger_than_the_server_reads_gets_the_form_back_with_413(browser, store):
    response = post_form(browser, prompt="x" * 300_000)

    assert response.status_code == 413 and response.mimetype == "text/html"
    assert "the prompt is too large" in response.get_data(as_text=True)
    assert store.redis.keys(keys.JOB_PREFIX + "*") == []


def test_a_submission_over_the_users_quota_is_429_with_retry_after(settings, make_app):
    browser = make_app(settings.model_copy(update={"max_queued_per_user": 1})).test_client()
    submit_via_form(browser, "first")

    response = post_form(browser, prompt="second")

    assert response.status_code == 429
    assert int(response.headers["Retry-After"]) >= 1
    assert "second</textarea>" in response.get_data(as_text=True)


@pytest.mark.parametrize("path", ["/jobs/{id}", "/jobs"])
def test_markup_in_a_prompt_is_shown_as_text(browser, path):
    job_id = submit_via_form(browser, XSS)

    response = browser.get(path.format(id=job_id))

    html = response.get_data(as_text=True)
    assert response.status_code == 200
    assert "<script>alert" not in html and "<img src=x" not in html
    for escaped in XSS_ESCAPED:
        assert escaped in html
    assert "default-src 'self'" in response.headers["Content-Security-Policy"]


def test_a_chat_job_shows_each_message_with_its_role(browser):
    messages = [{"role": "system", "content": "be <brief>"}, {"role": "user", "content": "and then?"}]
    token = form_token(browser)
    job = browser.post("/v1/jobs", json={"messages": messages}, headers={"X-CSRF-Token": token}).get_json()

    html = browser.get(f"/jobs/{job['id']}").get_data(as_text=True)

    shown = re.findall(r'<p class="role">(\w+)</p>\s*<pre class="text">\n([^<]*)</pre>', html)
    assert shown == [("system", "be &lt;brief&gt;"), ("user", "and then?")]
    assert f'<a href="/jobs/{job["id"]}">and then?</a>' in browser.get("/jobs").get_data(as_text=True)


def test_the_list_shows_the_visitors_jobs_newest_first_with_links(browser):
    ids = [submit_via_form(browser, f"prompt number {n}") for n in range(3)]

    html = browser.get("/jobs").get_data(as_text=True)

    links = re.findall(r'<a href="/jobs/(job_[\w-]+)">([^<]*)</a>', html)
    assert links == [(job_id, f"prompt number {n}") for n, job_id in reversed(list(enumerate(ids)))]
    assert html.count('data-status="queued"') == 3


def test_a_long_prompt_is_cut_short_in_the_list(browser):
    submit_via_form(browser, "word " * 100)

    html = browser.get("/jobs").get_data(as_text=True)

    excerpt = re.search(r'<a href="/jobs/job_[\w-]+">([^<]*)</a>', html).group(1)  # type: ignore[union-attr]
    assert len(excerpt) == 80 and excerpt.endswith("…")


def test_an_unknown_job_is_a_404_page(browser):
    response = browser.get("/jobs/job_nope")

    assert response.status_code == 404
    assert response.mimetype == "text/html"
    assert "No such job" in response.get_data(as_text=True)


def test_with_keys_configured_a_browser_signs_in_with_its_key(settings, make_app):
    users = settings.model_validate({"users": "alice:ka,bob:kb"}).users
    client = make_app(settings.model_copy(update={"users": users})).test_client()

    assert client.get("/").status_code == 303 and client.get("/").headers["Location"].endswith("/login")
    page = client.get("/login").get_data(as_text=True)
    token = page.split('name="csrf_token" value="')[1].split('"')[0]
    assert client.post("/login", data={"key": "nope", "csrf_token": token}).status_code == 401
    assert client.post("/login", data={"key": "ka", "csrf_token": "forged"}).status_code == 400
    assert client.post("/login", data={"key": "ka", "csrf_token": token}).status_code == 303

    form = client.get("/").get_data(as_text=True)
    token = form.split('name="csrf_token" value="')[1].split('"')[0]
    submitted = client.post("/jobs", data={"prompt": "mine", "max_tokens": "4", "csrf_token": token})
    job_id = submitted.headers["Location"].rsplit("/", 1)[1]
    # the job is alice's: her API key sees it, bob's does not
    assert client.get(f"/v1/jobs/{job_id}", headers={"Authorization": "Bearer ka"}).status_code == 200
    assert client.get(f"/v1/jobs/{job_id}", headers={"Authorization": "Bearer kb"}).status_code == 404
