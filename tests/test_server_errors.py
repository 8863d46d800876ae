"""What gunicorn refuses before the app sees it (a request line or a header it cannot read) is answered in the
API's JSON error shape too, under the real `onelane web`, with the status gunicorn chose and nothing of the input."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import pytest

from tests.test_body_limit import gunicorn_web  # noqa: F401  (`onelane web` on a free port: a fixture)

MALFORMED = [
    ("a 10 kB URL", b"GET /v1/jobs?" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "uri_too_long"),
    (
        "a 100 kB Last-Event-ID",
        b"GET /v1/jobs/j/events HTTP/1.1\r\nHost: x\r\nLast-Event-ID: " + b"1" * 100_000 + b"\r\n\r\n",
        431,
        "request_header_fields_too_large",
    ),
    ("a DEL byte in a header", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Note: a\x7fb\r\n\r\n", 400, "bad_request"),
    ("a malformed request line", b"GET\r\n\r\n", 400, "bad_request"),
]


def send_raw(base_url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `request` as is on a plain socket; read the answer until the server closes the connection."""
    url = urlsplit(base_url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize(("name", "request_bytes", "status", "error_type"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_request_gunicorn_cannot_read_gets_a_json_error(
    gunicorn_web,  # noqa: F811  (the fixture imported above)
    name,
    request_bytes,
    status,
    error_type,
):
    got, headers, body = send_raw(gunicorn_web, request_bytes)

    assert got == status, body
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    error = json.loads(body)["error"]
    assert set(error) == {"type", "message"} and error["type"] == error_type
    assert "aaaa" not in error["message"] and "1111" not in error["message"] and "\x7f" not in error["message"]
