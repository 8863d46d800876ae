"""Property-based fuzzing of every endpoint through the Flask test client: whatever a client sends, no 5xx, and
every 4xx of the JSON API is a JSON error.

No worker runs: a canceller thread (playing a client who cancels each job the moment it is admitted) ends
every job, so the waits of OpenAI requests and the event streams end by themselves. FUZZ_EXAMPLES=N runs N
examples per test instead of the bounded default.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "500"))
MODEL = "onelane-demo"
METHODS = ["GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"]
PAGES = re.compile(r"/(jobs(/[^/]*)?|login)?")  # their own errors may be HTML pages
STREAM_READ_S = 3.0  # the longest a response body is read: an event stream must have ended by then
SENT: Counter[str] = Counter()  # requests sent, and answers by status


@pytest.fixture
def settings(settings):  # type: ignore[no-untyped-def]
    # large bounds: a 429 or 503 must not hide what the request would have done
    return settings.model_copy(update={"model": None, "max_queue": 10**6, "max_queued_per_user": 10**6})


@pytest.fixture
def world(app, canceller):  # type: ignore[no-untyped-def]
    """Two clients (a browser with its session, a stranger with none) and a job of each owner."""
    browser, stranger = app.test_client(), app.test_client(use_cookies=False)
    token = re.search(r'name="csrf_token" value="([^"]+)"', browser.get("/").get_data(as_text=True)).group(1)
    mine = browser.post("/v1/jobs", json={"prompt": "mine"}, headers={"X-CSRF-Token": token}).get_json()["id"]
    local = stranger.post("/v1/jobs", json={"prompt": "local"}).get_json()["id"]
    return {"browser": browser, "stranger": stranger, "token": token, "ids": [mine, local, "job_nope"]}


# --- what clients send -----------------------------------------------------------------------------------

surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
odd_texts = st.text(st.characters() | surrogates, max_size=30) | st.sampled_from(["", " ", "0", "-1", "\x00", "😀"])
prompts = st.text(max_size=40) | odd_texts
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=40)
numbers = st.integers() | st.sampled_from([0, -1, 1, 2**63, 2**64, 10**400, -(10**400)]) | st.floats()
json_values = st.recursive(
    st.none() | st.booleans() | numbers | odd_texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(odd_texts, inner, max_size=4),
    max_leaves=12,
)
ROLES = ["user", "system", "assistant", "developer", "tool", "wizard"]
parts = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": prompts}), max_size=2)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(ROLES), "content": prompts | parts | st.none()}, optional={"name": prompts}
    ),
    min_size=1,
    max_size=3,
)
SAMPLING = {  # valid values: `mutated` below puts a wrong one in (a field's value replaced, a field added)
    "max_tokens": st.integers(1, 64),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "seed": st.integers(0, 2**63 - 1),
    "ignore_eos": st.booleans(),
    "stop": st.text(min_size=1, max_size=8) | st.lists(st.text(min_size=1, max_size=8), max_size=4),
}
MODELS = st.sampled_from([MODEL, "gpt-4o"])
PRIORITIES = st.sampled_from(["interactive", "batch", "urgent"])
JOB_FIELDS = {
    **SAMPLING,
    "ttl_s": st.floats(1, 600),
    "abandon_on_disconnect": st.booleans(),
    "model": MODELS,
    "priority": PRIORITIES,
}
OPENAI_FIELDS = {
    **SAMPLING,
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "n": st.just(1),
    "user": prompts,
    "max_completion_tokens": st.integers(1, 64),
    "service_tier": st.sampled_from(["auto", "default", "flex", "priority", "scale"]) | st.none(),
}


@st.composite
def mutated(draw: st.DrawFn, body: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    """A plausible body, sometimes with one field's value replaced by any JSON, or a field added."""
    value = draw(body)
    if value and draw(st.integers(0, 3)) == 0:
        value[draw(st.sampled_from(sorted(value)) | odd_texts)] = draw(json_values)
    return value


job_messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(ROLES[:3]), "content": prompts}), min_size=1, max_size=3
)
job_bodies = mutated(
    st.fixed_dictionaries({"prompt": prompts}, optional=JOB_FIELDS)
    | st.fixed_dictionaries({"messages": job_messages}, optional=JOB_FIELDS)
)
openai_bodies = mutated(
    st.fixed_dictionaries({"model": MODELS, "prompt": prompts | st.lists(prompts)}, optional=OPENAI_FIELDS)
    | st.fixed_dictionaries({"model": MODELS, "messages": messages}, optional=OPENAI_FIELDS)
)


def as_json(value: Any, ascii_only: bool) -> bytes:
    """JSON text as a client might send it: surrogates escaped, or written raw (as CESU-8 bytes)."""
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def json_text(values: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """Bodies as clients write them, and now and then a well-formed one nested deeper than any request needs."""
    written = st.tuples(values, st.booleans()).map(lambda args: as_json(*args))
    return st.one_of(written, written, written, deep_json)


deep_json = st.integers(2, 100_000).map(lambda n: b'{"prompt": "a", "stop": ' + b"[" * n + b"]" * n + b"}")


form_values = {
    "max_tokens": st.integers(-1, 5000).map(str) | header_text,
    "temperature": st.floats(-1, 3).map(str) | header_text,
    "ignore_eos": st.just("true") | header_text,
    "csrf_token": st.just("TOKEN") | header_text,
    "key": st.sampled_from(["ka", "kb"]) | header_text,
    "model": MODELS | header_text,
    "priority": PRIORITIES | header_text,
}
form_bodies = st.fixed_dictionaries({"prompt": prompts}, optional=form_values).map(
    lambda form: "&".join(f"{k}={quote(v.encode('utf-8', 'surrogatepass'))}" for k, v in form.items()).encode()
)
any_body = st.one_of(
    json_text(job_bodies | openai_bodies | json_values),
    st.binary(max_size=200),
    st.integers(1, 100_000).map(lambda n: b"[" * n),
    st.integers(1, 5_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    form_bodies,
    st.none(),
)
content_types = (
    st.sampled_from(
        [
            "application/json",
            "application/json; charset=utf-8",
            "application/json; charset=utf-16",
            "application/x+json",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "multipart/form-data",
            "text/plain",
        ]
    )
    | header_text
)
odd_headers = {
    "Content-Type": content_types,
    "Authorization": st.sampled_from(["Bearer k", "Bearer ka", "Bearer ", "Basic a2E="])
    | header_text.map("Bearer {}".format)
    | header_text,
    "X-CSRF-Token": st.just("TOKEN") | header_text,
    "Last-Event-ID": st.integers(-3, 5).map(str) | st.just("9" * 30) | st.just("") | header_text,
    "Sec-Fetch-Site": st.sampled_from(["cross-site", "same-site", "same-origin", "none"]),
}
PATHS = [
    "/v1/jobs",
    "/v1/jobs/{id}",
    "/v1/jobs/{id}/events",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/completions",
    "/",
    "/jobs",
    "/jobs/{id}",
    "/login",
    "/healthz",
    "/readyz",
    "/metrics",
    "/{id}",
    "/v1/{id}",
]
PLAUSIBLE = {  # each endpoint as its clients call it: method, body
    "/v1/jobs": [("POST", json_text(job_bodies))] * 3 + [("GET", st.none())],
    "/v1/jobs/{id}": [("GET", st.none()), ("DELETE", st.none())],
    "/v1/jobs/{id}/events": [("GET", st.none())],
    "/v1/models": [("GET", st.none())],
    "/v1/chat/completions": [("POST", json_text(openai_bodies))],
    "/v1/completions": [("POST", json_text(openai_bodies))],
    "/jobs": [("POST", form_bodies), ("GET", st.none())],
    "/login": [("POST", form_bodies), ("GET", st.none())],
}


@st.composite
def requests(draw: st.DrawFn, ids: list[str], paths: list[str] = PATHS, odd: float = 0.5) -> dict[str, Any]:
    """One request to one of `paths` (endpoints or anything): as its clients send it, or (with probability `odd`)
    any method and body; a few headers, plausible or odd; a query."""
    job_id = draw(st.sampled_from(ids) | odd_texts.map(lambda t: quote(t.encode("utf-8", "surrogatepass"), safe="")))
    template = draw(st.sampled_from(paths))
    odd_body = template not in PLAUSIBLE or draw(st.floats(0, 1)) < odd
    if not odd_body:
        method, data = draw(st.sampled_from(PLAUSIBLE[template]))
        data = draw(data)
        plausible_type = "application/x-www-form-urlencoded" if template in ("/jobs", "/login") else "application/json"
        headers = {"Content-Type": plausible_type} if data is not None else {}
        headers |= {"X-CSRF-Token": "TOKEN"} if draw(st.integers(0, 3)) else {}  # a browser's script sends it
    else:
        method, data, headers = draw(st.sampled_from(METHODS)), draw(any_body), {}
    names = sorted(odd_headers) if odd_body else sorted(set(odd_headers) - {"Content-Type"})
    for name in draw(st.sets(st.sampled_from(names), max_size=2)):
        headers[name] = draw(odd_headers[name])
    query = draw(st.dictionaries(st.sampled_from(["limit", "last_event_id", "x"]), header_text, max_size=2))
    return {
        "method": method,
        "path": template.format(id=job_id),
        "query": query,
        "headers": headers,
        "data": data,
        "browser": draw(st.booleans()),
    }


# --- what the server must answer ------------------------------------------------------------------------


def send(world: dict[str, Any], request: dict[str, Any]) -> tuple[Any, bytes]:
    """Send one request; read its answer, a stream for at most STREAM_READ_S (by then it must have ended)."""
    client = world["browser"] if request["browser"] else world["stranger"]
    headers = dict(request["headers"])
    if headers.get("X-CSRF-Token") == "TOKEN":
        headers["X-CSRF-Token"] = world["token"]
    data = (
        request["data"].replace(b"csrf_token=TOKEN", b"csrf_token=" + world["token"].encode())
        if isinstance(request["data"], bytes)
        else request["data"]
    )
    SENT["requests"] += 1
    response = client.open(
        request["path"],
        method=request["method"],
        headers=headers,
        data=data,
        query_string=request["query"],
        buffered=False,
    )
    deadline, chunks = time.monotonic() + STREAM_READ_S, []
    try:
        for chunk in response.response:
            chunks.append(chunk if isinstance(chunk, bytes) else chunk.encode())
            assert time.monotonic() < deadline, f"a stream was still open after {STREAM_READ_S} s"
    finally:
        response.close()
    return response, b"".join(chunks)


def check(request: dict[str, Any], response: Any, body: bytes) -> None:
    """No 5xx (bar the overload answers, with Retry-After, and /readyz saying no worker runs); the API's errors
    are JSON error objects; no answer carries a stack trace."""
    status, path = response.status_code, request["path"]
    assert b"Traceback" not in body and b'File "' not in body
    if status >= 500:
        assert (status == 503 and "Retry-After" in response.headers) or (path == "/readyz" and status == 503), body
    if status >= 400 and request["method"] != "HEAD" and not PAGES.fullmatch(path):
        assert response.mimetype == "application/json", (status, body[:200])
        error = json.loads(body)["error"]
        assert isinstance(error, dict) and isinstance(error["message"], str)


def fuzz(world: dict[str, Any], request: dict[str, Any]) -> None:
    response, body = send(world, request)
    SENT[str(response.status_code)] += 1
    check(request, response, body)


FUZZ = hypothesis_settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FUZZ
@given(data=st.data())
def test_no_request_gets_a_5xx_and_api_errors_are_json(world, data):
    fuzz(world, data.draw(requests(world["ids"])))


@FUZZ
@given(data=st.data())
def test_no_submission_gets_a_5xx(world, data):
    paths = ["/v1/jobs", "/v1/chat/completions", "/v1/completions", "/jobs", "/login"]
    fuzz(world, data.draw(requests(world["ids"], paths, odd=0.2)))


@pytest.fixture
def keyed_world(settings, make_app, canceller):  # type: ignore[no-untyped-def]
    """The same, with API keys configured: alice's browser signed in, and a stranger."""
    users = settings.model_validate({"users": "alice:ka,bob:kb"}).users
    app = make_app(settings.model_copy(update={"users": users}))
    browser = app.test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"', browser.get("/login").get_data(as_text=True)).group(1)
    assert browser.post("/login", data={"key": "ka", "csrf_token": token}).status_code == 303
    token = re.search(r'name="csrf_token" value="([^"]+)"', browser.get("/").get_data(as_text=True)).group(1)
    mine = browser.post("/v1/jobs", json={"prompt": "mine"}, headers={"Authorization": "Bearer ka"}).get_json()["id"]
    return {
        "browser": browser,
        "stranger": app.test_client(use_cookies=False),
        "token": token,
        "ids": [mine, "job_nope"],
    }


@FUZZ
@given(data=st.data())
def test_with_api_keys_no_request_gets_a_5xx(keyed_world, data):
    fuzz(keyed_world, data.draw(requests(keyed_world["ids"])))


def test_zz_report_how_many_requests_were_sent():
    """Printed for the record (pytest -s, or -rP): how many requests the fuzz tests above sent."""
    statuses = ", ".join(f"{status}: {n}" for status, n in sorted(SENT.items()) if status != "requests")
    print(f"fuzz: {SENT['requests']} requests sent; answers by status: {statuses}")
