"""The body limit holds however a body is sent: with a Content-Length, or chunked, under Werkzeug's server and
under gunicorn with gevent (what `onelane web` runs)."""

from __future__ import annotations

import http.client
import json
import re
from urllib.parse import urlsplit

import pytest
import requests

from tasks import keys

PROMPT_CHARS = 1000  # a small limit keeps the bodies small: 1000 * 12 + 64 KiB = 77,536 bytes


@pytest.fixture
def settings(settings):  # type: ignore[no-untyped-def]
    return settings.model_copy(update={"max_prompt_chars": PROMPT_CHARS, "model": None})


def limit() -> int:
    return PROMPT_CHARS * 12 + 64 * 1024


def post_chunked(base_url: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
    """POST `body` with Transfer-Encoding: chunked (no Content-Length), on a plain socket."""
    url = urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.putrequest("POST", path)
        for name, value in {**headers, "Transfer-Encoding": "chunked"}.items():
            conn.putheader(name, value)
        conn.endheaders()
        try:
            for start in range(0, len(body), 16384):
                piece = body[start : start + 16384]
                conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            conn.send(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):  # the server answered before reading it all
            pass
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        conn.close()


def check_chunked_limits(base_url: str, store) -> None:  # type: ignore[no-untyped-def]
    """What both servers must do with chunked bodies: admit one within the limit, refuse one beyond it with 413."""
    json_type = {"Content-Type": "application/json"}
    small = json.dumps({"prompt": "chunked and small", "max_tokens": 4}).encode()
    status, _, answer = post_chunked(base_url, "/v1/jobs", small, json_type)
    assert status == 202, answer
    assert json.loads(answer)["prompt"] == "chunked and small"

    body = json.dumps({"prompt": "x" * (limit() + 10_000)}).encode()
    status, content_type, answer = post_chunked(base_url, "/v1/jobs", body, json_type)
    assert (status, content_type) == (413, "application/json"), answer
    assert json.loads(answer)["error"]["type"] == "payload_too_large"

    chat = {"model": "onelane-demo", "messages": [{"role": "user", "content": "x" * (limit() + 10_000)}]}
    status, content_type, answer = post_chunked(base_url, "/v1/chat/completions", json.dumps(chat).encode(), json_type)
    assert (status, content_type) == (413, "application/json"), answer
    assert json.loads(answer)["error"]["code"] == "payload_too_large"

    session = requests.Session()
    token = re.search(r'name="csrf_token" value="([^"]+)"', session.get(f"{base_url}/", timeout=10).text).group(1)
    cookie = "; ".join(f"{c.name}={c.value}" for c in session.cookies)
    form = f"csrf_token={token}&max_tokens=4&prompt=".encode() + b"x" * (limit() + 10_000)
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie}
    status, content_type, answer = post_chunked(base_url, "/jobs", form, headers)
    assert status == 413 and content_type.startswith("text/html"), answer
    assert b"the prompt is too large" in answer

    assert len(store.redis.keys(keys.JOB_PREFIX + "*")) == 1  # the small one only


def test_a_chunked_body_is_held_to_the_limit_under_werkzeug(live_server, store):
    check_chunked_limits(live_server, store)


@pytest.fixture
def gunicorn_web(web_process) -> str:  # type: ignore[no-untyped-def]
    """`onelane web` (gunicorn + gevent) on a free port, against the test Redis; its base URL."""
    base_url, _ = web_process(ONELANE_MAX_PROMPT_CHARS=str(PROMPT_CHARS))
    return base_url


def test_a_chunked_body_is_held_to_the_limit_under_gunicorn(gunicorn_web, store):
    check_chunked_limits(gunicorn_web, store)
