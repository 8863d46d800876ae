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
    assert (job["prompt"], job["messages"]) == (None, [{"role": "user", "content": "hello there"}])  # a chat turn
    raw = browser.get(f"/v1/jobs/{submit_via_form(browser, 'once upon a', raw='true')}").get_json()
    assert (raw["prompt"], raw["messages"]) == ("once upon a", None)  # text to continue
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
    ("max tokens above the limit", {"max_tokens": "1000001"}, 422, "max_tokens may be at most 1000000"),
    ("max tokens not a whole number", {"max_tokens": "1.5"}, 422, "max_tokens"),
    ("temperature too high", {"temperature": "5"}, 422, "temperature"),
    ("temperature not a number", {"temperature": "warm"}, 422, "temperature"),
    ("prompt too large", {"prompt": "x" * 200_001}, 413, "this server accepts at most 200000"),
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
    response = post_form(browser, prompt="x" * 2_500_000)

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


def test_an_empty_prompt_shows_the_form_again_naming_the_prompt(browser, store):
    response = post_form(browser, prompt="", max_tokens="8")

    html = response.get_data(as_text=True)
    assert response.status_code == 422 and response.mimetype == "text/html"
    assert "the prompt is empty" in html and 'aria-invalid="true"' in html.split('name="prompt"')[1].split(">")[0]
    assert store.redis.keys(keys.JOB_PREFIX + "*") == []


# --- CSRF: every request a browser could be made to send from another site must carry the session's token ---


def test_a_form_post_without_a_session_admits_nothing(app, store):
    stranger = app.test_client(use_cookies=False)  # what another site's page makes a browser send: no cookie

    response = stranger.post("/jobs", data={"prompt": "from elsewhere", "max_tokens": "4"})

    assert 400 <= response.status_code < 500
    assert store.redis.keys(keys.NS + "*") == []


@pytest.mark.parametrize("token", [None, "", "forged", "é", "\u2603" * 32, "tok\x00en"])
def test_a_form_post_with_the_session_but_not_its_token_admits_nothing(browser, store, token):
    form_token(browser)  # the browser has a session
    fields = {"prompt": "hi", "max_tokens": "4"} | ({} if token is None else {"csrf_token": token})

    response = browser.post("/jobs", data=fields)

    assert response.status_code == 403 and response.mimetype == "text/html"
    assert "CSRF token" in response.get_data(as_text=True)
    assert store.redis.keys(keys.JOB_PREFIX + "*") == []


def test_a_form_post_with_its_token_is_admitted(browser):
    response = post_form(browser, prompt="mine", max_tokens="4")
    assert response.status_code == 303 and response.headers["Location"].startswith("/jobs/job_")


@pytest.mark.parametrize("token", ["é", "\u00ff" * 40])
def test_a_non_ascii_token_on_a_cookie_authenticated_api_call_is_refused_not_a_crash(browser, store, token):
    job_id = submit_via_form(browser, "keep me")

    by_header = browser.delete(f"/v1/jobs/{job_id}", headers={"X-CSRF-Token": token})
    by_field = browser.delete(f"/v1/jobs/{job_id}", data={"csrf_token": token})
    submitted = browser.post("/v1/jobs", json={"prompt": "x"}, headers={"X-CSRF-Token": token})

    for response in (by_header, by_field, submitted):
        assert response.status_code == 403
        assert response.get_json()["error"]["type"] == "forbidden"
    assert browser.get(f"/v1/jobs/{job_id}").get_json()["status"] == "queued"
    assert len(store.redis.keys(keys.JOB_PREFIX + "*")) == 1


@pytest.mark.parametrize("site", ["cross-site", "same-site", "Cross-Site"])
def test_a_json_post_another_site_made_is_refused_without_a_bearer_key(app, store, site):
    client = app.test_client(use_cookies=False)

    refused = client.post("/v1/jobs", json={"prompt": "x"}, headers={"Sec-Fetch-Site": site})
    chat = client.post("/v1/chat/completions", json={"model": "m", "messages": []}, headers={"Sec-Fetch-Site": site})

    assert refused.status_code == 403 and refused.get_json()["error"]["type"] == "forbidden"
    assert chat.status_code == 403
    assert store.redis.keys(keys.NS + "*") == []
    keyed = client.post("/v1/jobs", json={"prompt": "x"}, headers={"Sec-Fetch-Site": site, "Authorization": "Bearer k"})
    assert keyed.status_code == 202


@pytest.mark.parametrize("headers", [{}, {"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"}])
def test_a_plain_api_client_in_local_mode_needs_no_cookie_nor_token(app, store, headers):
    client = app.test_client(use_cookies=False)

    response = client.post("/v1/jobs", json={"prompt": "curl"}, headers=headers)

    assert response.status_code == 202
    assert [job.id for job in store.list("local")] == [response.get_json()["id"]]
    assert client.delete(f"/v1/jobs/{response.get_json()['id']}").status_code == 200


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_a_post_any_page_can_send_needs_a_session_and_its_token(app, store, content_type):
    client = app.test_client(use_cookies=False)

    response = client.post("/v1/jobs", data='{"prompt": "x"}', content_type=content_type)

    assert response.status_code == 403
    assert store.redis.keys(keys.NS + "*") == []


def test_a_non_ascii_token_at_sign_in_is_refused_not_a_crash(settings, make_app):
    users = settings.model_validate({"users": "alice:ka"}).users
    client = make_app(settings.model_copy(update={"users": users})).test_client()
    client.get("/login")

    assert client.post("/login", data={"key": "ka", "csrf_token": "é"}).status_code == 400
    assert client.post("/login", data={"key": "ka"}).status_code == 400
    stranger = make_app(settings.model_copy(update={"users": users})).test_client(use_cookies=False)
    assert stranger.post("/login", data={"key": "ka", "csrf_token": "x"}).status_code == 400
