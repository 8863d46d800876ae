"""Image URLs at the door (issue 60, item 1): the web fetches an image URL only from a host the operator lists, only
from a public address (unless the operator allows private ones), exactly the URL it checked, following no redirect,
within one deadline for the whole fetch; and it tells the client no address, port or status of what it reached.

Each story sends its URLs through chat completions, Anthropic's messages and their count_tokens, at a model that
reads images (a folder with a vision config: the door refuses before any worker is asked), with an image server on
this machine's loopback that records every request it gets.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from PIL import Image

from tasks.settings import Settings
from tests.test_hostile_models import serve

pytestmark = pytest.mark.timeout(120)

ROUTES = ("chat", "messages", "count_tokens")


def png(color: str = "red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(out, "PNG")
    return out.getvalue()


class ImageServer(http.server.ThreadingHTTPServer):
    """Serves /red.png; /moved.png redirects to /secret (on loopback); /drip.png sends a byte a second; /huge.png more
    than the byte limit. Records the path of every request it gets."""

    daemon_threads = True

    def __init__(self, huge: int) -> None:
        self.asked: list[str] = []
        self.huge = huge
        self.stopping = threading.Event()
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(http.server.BaseHTTPRequestHandler):
    server: ImageServer

    def do_GET(self) -> None:  # noqa: N802
        self.server.asked.append(self.path)
        if self.path == "/moved.png":
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/secret")
            self.end_headers()
        elif self.path == "/drip.png":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            try:
                for byte in png():  # a byte a second, for a minute: each read gets its byte in time
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    if self.server.stopping.wait(1.0):
                        return
            except OSError:  # (the door hung up)
                return
        elif self.path == "/huge.png":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"\0" * self.server.huge)
        elif self.path in ("/red.png", "/secret"):
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            self.wfile.write(png())
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def images(settings: Settings) -> Iterator[ImageServer]:
    server = ImageServer(settings.image_max_bytes + 65536)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server
    server.stopping.set()
    server.shutdown()
    server.server_close()


def vision_folder(root: Path, size: int = 32) -> Path:
    """A model folder the catalog reads as one that reads images (its config has a vision_config), its processor's
    images `size` x `size` (as Gemma 3's); no worker loads it."""
    folder = root / f"eyes-{size}"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "gemma3", "vision_config": {}}))
    (folder / "preprocessor_config.json").write_text(json.dumps({"size": {"height": size, "width": size}}))
    return folder


@pytest.fixture
def door(settings: Settings, demo_model: Path, tmp_path: Path, make_app):  # type: ignore[no-untyped-def]
    """A live web serving a text model and one that reads images ("eyes"), with the image settings a story gives."""
    from werkzeug.serving import make_server

    servers = []

    def start(**update: Any) -> str:
        served, _ = serve(
            settings.model_copy(update=update),
            tmp_path,
            chat={"path": str(demo_model), "default": True},
            eyes={"path": str(vision_folder(tmp_path))},
        )
        server = make_server("127.0.0.1", 0, make_app(served), threaded=True)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server in servers:
        server.shutdown()


def ask(base: str, route: str, url: str) -> requests.Response:
    """`url` as the image of a question, through `route`."""
    if route == "chat":
        parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]
        body: dict[str, Any] = {"model": "eyes", "messages": [{"role": "user", "content": parts}], "max_tokens": 4}
        return requests.post(f"{base}/v1/chat/completions", json=body, timeout=60)
    blocks = [{"type": "image", "source": {"type": "url", "url": url}}, {"type": "text", "text": "?"}]
    body = {"model": "eyes", "messages": [{"role": "user", "content": blocks}]}
    if route == "messages":
        body["max_tokens"] = 4
    path = "/v1/messages" if route == "messages" else "/v1/messages/count_tokens"
    return requests.post(f"{base}{path}", json=body, timeout=60)


def refused(reply: requests.Response, *words: str) -> str:
    """The refusal's message: a 400 in the route's shape, naming what `words` say, and nothing of what was reached."""
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    message = str(error["message"])
    assert error["type"] in ("invalid_request", "invalid_request_error"), error
    for word in words:
        assert word in message, message
    return message


@pytest.mark.parametrize("route", ROUTES)
def test_a_url_that_parsers_read_two_ways_is_refused_before_anything_is_fetched(route, door, images):
    # Given a server whose operator lists images.example.com, and an image server on this machine's loopback
    base = door(image_hosts=("images.example.com",))
    port = images.server_port
    # When URLs that name the listed host to one parser and loopback to another come, in each spelling of loopback
    two_ways = [
        f"http://127.0.0.1:{port}\\@images.example.com/red.png",  # (requests went to 127.0.0.1, the check saw example)
        f"http://2130706433:{port}\\@images.example.com/red.png",  # 127.0.0.1 as one decimal number
        f"http://[::ffff:127.0.0.1]:{port}\\@images.example.com/red.png",  # mapped into IPv6
        f"http://images.example.com\t@127.0.0.1:{port}/red.png",
    ]
    for url in two_ways:
        message = refused(ask(base, route, url), "backslash, whitespace")
        assert str(port) not in message and "127.0.0.1" not in message
    # and one with a user name
    message = refused(ask(base, route, f"http://images.example.com:{port}@127.0.0.1:{port}/red.png"), "user name")
    # Then none was fetched: the image server was never asked
    assert images.asked == []


@pytest.mark.parametrize("route", ROUTES)
def test_a_listed_name_that_resolves_to_loopback_is_not_fetched(route, door, images):
    # Given an operator who lists names that resolve to this machine (localhost, and 127.0.0.1 spelled as numbers)
    base = door(image_hosts=("localhost", "2130706433", "0x7f.1", "127.1"))
    port = images.server_port
    # When an image is asked for from each
    for host in ("localhost", "2130706433", "0x7f.1", "127.1"):
        message = refused(ask(base, route, f"http://{host}:{port}/red.png"), "could not be fetched")
        # Then it is refused without a word of what the name resolved to
        assert str(port) not in message and "127.0.0.1" not in message
    assert images.asked == []  # and nothing was asked of the server


def test_with_private_hosts_allowed_a_listed_local_server_is_fetched_and_nothing_else(door, images, settings):
    # Given an operator who lists this machine's image server and lets a listed host be a private address
    base = door(image_hosts=("127.0.0.1",), image_private_hosts=True)
    root = f"http://127.0.0.1:{images.server_port}"

    def job(path: str, url: str | None = None) -> requests.Response:
        parts = [{"type": "image_url", "image_url": {"url": url or f"{root}{path}"}}, {"type": "text", "text": "?"}]
        body = {"model": "eyes", "messages": [{"role": "user", "content": parts}], "max_tokens": 4}
        return requests.post(f"{base}/v1/jobs", json=body, timeout=30)

    # When its image is asked for, Then it is fetched and kept as an inline image would be
    fetched = job("/red.png")
    assert fetched.status_code == 202, fetched.text
    image = fetched.json()["messages"][0]["images"][0]
    assert (image["digest"], image["mime"]) == (hashlib.sha256(png()).hexdigest(), "image/png")
    # a redirect (to loopback) is not followed, a missing image is refused, and neither says what answered
    for path in ("/moved.png", "/missing.png"):
        reply = job(path)
        message = reply.json()["error"]["message"]
        assert reply.status_code == 422 and "could not be fetched" in message, reply.text  # (/v1/jobs: 422)
        assert not any(word in message for word in ("302", "404", str(images.server_port), "HTTP")), message
    assert "/secret" not in images.asked
    # an image past the byte limit is refused for its size
    huge = job("/huge.png")
    assert huge.status_code == 413 and "more than" in huge.json()["error"]["message"], huge.text
    # and a name not listed is refused by name, never asked
    asked = len(images.asked)
    other = job("", f"http://localhost:{images.server_port}/red.png")
    assert other.status_code == 422, other.text
    assert len(images.asked) == asked


@pytest.mark.parametrize("route", ROUTES)
def test_a_server_that_drips_its_image_is_cut_at_the_whole_fetch_bound(route, door, images):
    # Given a listed image server that sends its image a byte a second (each read gets a byte well within any
    # timeout of one read), and a whole fetch bound of 2 s
    base = door(image_hosts=("127.0.0.1",), image_private_hosts=True, image_fetch_s=2.0)
    url = f"http://127.0.0.1:{images.server_port}/drip.png"
    # When the image is asked for
    began = time.monotonic()
    reply = ask(base, route, url)
    took = time.monotonic() - began
    # Then it is refused once the bound has passed (not a minute later, when the last byte comes): 2 s, plus the
    # request's own time on a loaded machine (generous: this shared machine has stalled a process for 2 s)
    refused(reply, "could not be fetched")
    assert 2.0 <= took < 8.0, took


def test_the_api_description_says_which_image_urls_are_fetched(live_server):
    # Given /openapi.json, When a client reads what an image part's URL may be (chat's image_url, a response's
    # input_image), Then it reads that http(s) URLs are fetched from the hosts the operator lists (it said they
    # were not fetched at all)
    schema = requests.get(f"{live_server}/openapi.json", timeout=30).json()
    told = [
        field["description"]
        for component in schema["components"]["schemas"].values()
        for name, field in component.get("properties", {}).items()
        if name in ("url", "image_url") and "data:image/png" in field.get("description", "")
    ]
    assert len(told) == 2, told
    for description in told:
        assert "not fetched" not in description and "ONELANE_IMAGE_HOSTS" in description, description


def test_under_gunicorn_and_gevent_a_fetch_keeps_its_deadline_and_its_checks(
    settings, demo_model, tmp_path, web_process, images
):
    # Given onelane web as it runs (gunicorn, gevent: look-ups, timers and sockets cooperative), listing this machine's
    # image server, private addresses allowed, a whole fetch bound of 2 s; and listing localhost, private ones not
    _, env = serve(
        settings,
        tmp_path,
        chat={"path": str(demo_model), "default": True},
        eyes={"path": str(vision_folder(tmp_path))},
    )
    private, _ = web_process(
        **env, ONELANE_IMAGE_HOSTS="127.0.0.1", ONELANE_IMAGE_PRIVATE_HOSTS="true", ONELANE_IMAGE_FETCH_S="2"
    )
    public, _ = web_process(**env, ONELANE_IMAGE_HOSTS="localhost")
    root = f"127.0.0.1:{images.server_port}"
    # When an image is fetched, Then it is read; one that drips is cut at 2 s; a redirect is not followed
    parts = [{"type": "image_url", "image_url": {"url": f"http://{root}/red.png"}}, {"type": "text", "text": "?"}]
    body = {"model": "eyes", "messages": [{"role": "user", "content": parts}], "max_tokens": 4}
    fetched = requests.post(f"{private}/v1/jobs", json=body, timeout=60)
    assert fetched.status_code == 202, fetched.text
    assert fetched.json()["messages"][0]["images"][0]["digest"] == hashlib.sha256(png()).hexdigest()
    began = time.monotonic()
    refused(ask(private, "chat", f"http://{root}/drip.png"), "could not be fetched")
    assert time.monotonic() - began < 8.0
    refused(ask(private, "messages", f"http://{root}/moved.png"), "could not be fetched")
    # and a listed name that resolves to loopback is never asked
    asked = len(images.asked)
    refused(ask(public, "chat", f"http://localhost:{images.server_port}/red.png"), "could not be fetched")
    assert len(images.asked) == asked and "/secret" not in images.asked
