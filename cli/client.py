"""An HTTP client of onelane's REST API: submit, get, list and cancel jobs, and follow a job's events; upload a
file, and create, read and cancel a batch of OpenAI's Batch API, and read its result files.

No Flask, no MLX: this is what `onelane run`, `jobs`, `cancel`, `tail` and `batch` use, from any machine that can
reach the web. A followed stream that drops is resumed with `Last-Event-ID`, so no token is lost or repeated.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests
import urllib3

from cli.url import DEFAULT_URL, find
from tasks.events import TERMINAL

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0  # a live stream sends a ping every ONELANE_SSE_PING_S (15 s): silence this long is a dead link
RESUME_FOR_S = 60.0  # how long a dropped stream keeps trying to resume before giving up
NO_KEY = "none"  # the key a client without one sends where a form needs one (any key, to a server without keys)


class ClientError(Exception):
    """Base class for the client's errors; the message is meant for the user."""


class Unreachable(ClientError):
    """The server could not be reached (or a stream could not be resumed in time)."""


class ApiError(ClientError):
    """The server answered with one of onelane's errors: {"error": {"type", "message", "param"}}."""

    def __init__(
        self, status: int, type_: str, message: str, param: str | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(f"{message} ({status} {type_})")
        self.status, self.type, self.message, self.param = status, type_, message, param
        self.retry_after_s = retry_after_s

    @property
    def overloaded(self) -> bool:
        """Refused for now (429/503 with Retry-After): the same request may succeed later."""
        return self.status in (429, 503) and self.retry_after_s is not None


@dataclass(frozen=True)
class ServerEvent:
    """One server-sent event: `queued`, `started`, `token`, `requeued` or a terminal one, with its log index.

    The client adds one type of its own, `reconnecting` (data: {"error"}), when a dropped stream is resumed.
    """

    type: str
    data: dict[str, Any] = field(default_factory=dict)
    id: int | None = None


@dataclass
class Client:
    """onelane's REST API at `base_url`, with an optional API key (sent as a bearer token); `found_by` says where
    the URL came from, in the errors of a server that does not answer."""

    base_url: str = DEFAULT_URL
    api_key: str | None = None
    session: requests.Session = field(default_factory=requests.Session)
    found_by: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Client:
        """ONELANE_URL, else the `onelane up` running from ONELANE_VAR_DIR, else http://127.0.0.1:8000
        (cli/url.py); and ONELANE_API_KEY."""
        found = find(environ)
        return cls(found.url, environ.get("ONELANE_API_KEY") or None, found_by=found.how)

    def submit(
        self, prompt: str | list[dict[str, Any]], raw: bool = False, images: list[str] | None = None, **fields: Any
    ) -> dict[str, Any]:
        """POST /v1/jobs: `prompt` as the user's turn of a chat (after `images`, data: URLs, if any), a whole
        conversation (its messages), or with `raw` as text to continue; options left None are not sent (the server's
        defaults apply). An answer that must be JSON: `response_format=json_format(schema)`."""
        if images and (raw or isinstance(prompt, list)):
            raise ClientError("an image goes with a question (your turn of a chat), not with --raw text")
        if isinstance(prompt, list):
            text: dict[str, Any] = {"messages": prompt}
        elif images:
            parts = [
                *({"type": "image_url", "image_url": {"url": url}} for url in images),
                {"type": "text", "text": prompt},
            ]
            text = {"messages": [{"role": "user", "content": parts}]}
        else:
            text = {"prompt": prompt} if raw else {"messages": [{"role": "user", "content": prompt}]}
        body = {**text, **{k: v for k, v in fields.items() if v is not None}}
        return self._json("POST", "/v1/jobs", json=body)

    def get(self, job_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/jobs/{job_id}")

    def jobs(self, limit: int = 50) -> list[dict[str, Any]]:
        """The caller's recent jobs, newest first."""
        return list(self._json("GET", "/v1/jobs", params={"limit": limit})["data"])

    def cancel(self, job_id: str) -> dict[str, Any]:
        """DELETE /v1/jobs/<id>: the job as it is after the cancel (ApiError 409 job_ended if it ended otherwise)."""
        return self._json("DELETE", f"/v1/jobs/{job_id}")

    def upload_file(self, name: str, data: bytes, purpose: str = "batch") -> dict[str, Any]:
        """POST /v1/files (multipart): `data` as a file called `name`, for `purpose`; the file object (its `id`).

        Without an API key it sends NO_KEY as one: a form with neither key nor session is what another site's page
        could post, which onelane refuses (web/auth.py check_csrf); a server without keys takes any key as its
        local user, one with keys refuses it (said as the missing key it is)."""
        headers = None if self.api_key else {"Authorization": f"Bearer {NO_KEY}"}
        return self._json("POST", "/v1/files", headers=headers, data={"purpose": purpose}, files={"file": (name, data)})

    def file_content(self, file_id: str) -> bytes:
        """GET /v1/files/<id>/content: the file's bytes (a batch's output or error file, JSONL)."""
        with self._request(
            "GET", f"/v1/files/{file_id}/content", timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
        ) as response:
            return response.content

    def create_batch(self, input_file_id: str, endpoint: str) -> dict[str, Any]:
        """POST /v1/batches: run the uploaded file's lines against `endpoint`, within 24 h; the batch object."""
        body = {"input_file_id": input_file_id, "endpoint": endpoint, "completion_window": "24h"}
        return self._json("POST", "/v1/batches", json=body)

    def get_batch(self, batch_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/batches/{batch_id}")

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        """POST /v1/batches/<id>/cancel: the batch as it is after the cancel (`cancelling` until what runs stopped;
        an ended batch is left as it is)."""
        return self._json("POST", f"/v1/batches/{batch_id}/cancel", json={})  # a JSON POST: a form would need a key

    def events(self, job_id: str, after: int = -1, resume_for_s: float = RESUME_FOR_S) -> Iterator[ServerEvent]:
        """The job's events after log index `after`, live, until its terminal event.

        A stream that drops is reopened with `Last-Event-ID` (the last index seen); after `resume_for_s` without
        a single event it gives up with Unreachable.
        """
        last, delay_s, failing_since = after, 1.0, None
        while True:
            try:
                for event in self._stream(job_id, last):
                    if event.type == "retry":
                        delay_s = event.data["ms"] / 1000
                        continue
                    failing_since = None
                    last = event.id if event.id is not None else last
                    yield event
                    if event.type in TERMINAL:
                        return
                error = "the stream ended before the job did"
            except (
                requests.ConnectionError,
                requests.Timeout,
                requests.exceptions.ChunkedEncodingError,
                urllib3.exceptions.HTTPError,
                Unreachable,
            ) as exc:
                error = _reason(exc)
            except ApiError as exc:
                if not exc.overloaded and exc.status < 500:
                    raise
                error, delay_s = exc.message, max(delay_s, exc.retry_after_s or 0)
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > resume_for_s:
                raise Unreachable(f"lost the stream of {job_id} and could not resume it: {error}")
            yield ServerEvent("reconnecting", {"error": error})
            time.sleep(delay_s)

    def _stream(self, job_id: str, last: int) -> Iterator[ServerEvent]:
        headers = {"Accept": "text/event-stream", "Accept-Encoding": "identity"}
        if last >= 0:
            headers["Last-Event-ID"] = str(last)
        with self._request(
            "GET",
            f"/v1/jobs/{job_id}/events",
            headers=headers,
            stream=True,
            timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S),
        ) as response:
            yield from parse_sse(lines(arriving(response)))

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        with self._request(method, path, timeout=(CONNECT_TIMEOUT_S, 30.0), **kwargs) as response:
            return response.json()  # type: ignore[no-any-return]  # (requests types json() as Any)

    def _request(
        self, method: str, path: str, headers: dict[str, str] | None = None, **kwargs: Any
    ) -> requests.Response:
        headers = dict(headers or {})
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = self.base_url.rstrip("/") + path
        try:
            response = self.session.request(method, url, headers=headers, **kwargs)
        except (requests.ConnectionError, requests.Timeout) as exc:
            found = f" ({self.found_by})" if self.found_by else ""
            raise Unreachable(f"cannot reach onelane at {self.base_url}{found}: {_reason(exc)}") from None
        if response.status_code >= 400:
            with response:
                error = api_error(response)
            raise self._unauthorized(error) if error.status == 401 else error
        return response

    def _unauthorized(self, error: ApiError) -> ApiError:
        """A 401, said with what to set: the key the client sends is ONELANE_API_KEY's (from_env)."""
        if self.api_key:
            message = f"{self.base_url} refused the key in ONELANE_API_KEY: {error.message}; set it to a key it knows"
        else:
            message = (
                f"{self.base_url} needs an API key: set ONELANE_API_KEY to yours, e.g. `export ONELANE_API_KEY=KEY`"
            )
        return ApiError(401, error.type, message, error.param)


def json_format(schema: dict[str, Any] | None = None, name: str = "answer") -> dict[str, Any]:
    """The `response_format` of an answer that must be JSON of `schema` (None: any JSON object)."""
    if schema is None:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def api_error(response: requests.Response) -> ApiError:
    """onelane's error body as an ApiError (a proxy's non-JSON error page too)."""
    try:
        error = response.json()["error"]
        type_, message, param = str(error["type"]), str(error["message"]), error.get("param")
    except (ValueError, KeyError, TypeError):
        type_, message, param = "http_error", response.reason or "error", None
    retry = response.headers.get("Retry-After", "")
    retry_after_s = float(retry) if retry.replace(".", "", 1).isdigit() else None
    return ApiError(response.status_code, type_, message, param, retry_after_s)


def arriving(response: requests.Response) -> Iterator[bytes]:
    """The body's bytes as they arrive, chunked or not (iter_content(None) waits for the end of an unchunked one)."""
    raw = response.raw
    if raw.chunked or not hasattr(raw, "read1"):  # read1: urllib3 >= 2.3
        return response.iter_content(chunk_size=None if raw.chunked else 1)
    return iter(lambda: raw.read1(65536, decode_content=True), b"")


def lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Text lines from a byte stream, as they complete (LF or CRLF; a partial last line is dropped)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line.removesuffix(b"\r").decode("utf-8", "replace")


def parse_sse(stream: Iterable[str]) -> Iterator[ServerEvent]:
    """Server-sent events from text lines; comments (pings) are skipped, `retry:` is a ServerEvent("retry", {"ms"})."""
    kind, data, event_id = "message", "", ""
    for line in stream:
        if not line:
            if data:
                yield ServerEvent(kind, json.loads(data), int(event_id) if event_id else None)
            kind, data, event_id = "message", "", ""
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            kind = value
        elif name == "data":
            data = f"{data}\n{value}" if data else value
        elif name == "id" and value.isascii() and value.isdigit():
            event_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            yield ServerEvent("retry", {"ms": int(value)})


def _reason(exc: Exception) -> str:
    """A short reason for a network error (requests' messages nest several exceptions deep)."""
    text = str(exc.args[0] if exc.args else exc)
    return text.rsplit(": ", 1)[-1].rstrip(")'\"") or type(exc).__name__
