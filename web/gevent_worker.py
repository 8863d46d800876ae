"""gunicorn's gevent worker, answering what gunicorn itself refuses in the API's JSON error shape.

gunicorn refuses a request it cannot read (a request line or a header too long, a character no header may hold, a
malformed request line) before the app sees it, with an HTML page that quotes the input. This worker keeps the
status gunicorn chooses and says it as web/errors.py does: a fixed message per kind, never the input nor an
exception's text. web/server.py names it as gunicorn's `worker_class`.
"""

from __future__ import annotations

import json
import socket
import ssl
import sys
import time
from http import HTTPStatus
from typing import Any

import gevent
from gunicorn import util
from gunicorn.http import errors as http
from gunicorn.workers.ggevent import GeventWorker

from web.errors import error_body

LINGER_S, LINGER_BYTES = 1.0, 1 << 20  # at most this long, and this much, read of what the client still sends


class JsonErrorsWorker(GeventWorker):  # type: ignore[misc]  # (gunicorn is untyped: GeventWorker is Any)
    """GeventWorker whose own error answers are JSON, and which quits once however many times it is told."""

    _quitting = False
    _ran = False  # run() has returned: the process is exiting on its own

    def run(self) -> None:
        try:
            super().run()
        finally:
            self._ran = True

    def handle_quit(self, sig: int, frame: Any) -> None:
        # Ctrl-C on `onelane up` reaches this worker and its master, which passes it on: a second quit, run while
        # the first one's exit is under way, would print a SystemExit traceback in the terminal
        if self._quitting:
            return
        self._quitting = True
        gevent.spawn(self._quit)

    def _quit(self) -> None:
        """gunicorn's quit, off the signal handler (as GeventWorker's), but no exit once run() has returned: the
        process is then exiting already, and an exit raised while its atexit handlers wait on the hub (a grammar
        checker's end) would print as their traceback."""
        self.alive = False
        self.cfg.worker_int(self)
        time.sleep(0.1)
        if not self._ran:
            sys.exit(0)

    def handle_error(self, req: Any, client: socket.socket, addr: Any, exc: BaseException) -> None:
        status, type_, message = self.refusal(exc)
        if status == 500:
            self.log.exception("Error handling request")
        else:
            self.log.warning("Invalid request from ip=%s: %s", (addr or ("",))[0], exc)  # as gunicorn's own
        body = json.dumps(error_body(type_, message)).encode()
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        try:
            util.write_nonblock(client, head.encode("latin-1") + body)
            _linger(client)
        except OSError:
            self.log.debug("Failed to send error message.")

    def refusal(self, exc: BaseException) -> tuple[int, str, str]:
        """(status, type, message): the status as gunicorn 27's Worker.handle_error chooses it, the first match."""
        cfg = self.cfg
        headers = (
            f"a header is longer than {cfg.limit_request_field_size} bytes, or there are more than "
            f"{cfg.limit_request_fields}"
        )
        for kinds, status, type_, message in (
            (
                (http.InvalidResponseHeader, http.InvalidResponseHeaderName),
                500,
                "internal_error",
                "internal error; it has been logged",
            ),  # a header the app sent: not the client's doing
            (
                http.LimitRequestLine,
                414,
                "uri_too_long",
                f"the request line is longer than {cfg.limit_request_line} bytes",
            ),
            (http.LimitRequestHeaders, 431, "request_header_fields_too_large", headers),
            (
                http.ExpectationFailed,
                417,
                "expectation_failed",
                "the Expect header asks for what this server does not do",
            ),
            (
                http.UnsupportedTransferCoding,
                501,
                "not_implemented",
                "this server does not support that Transfer-Encoding",
            ),
            ((http.ForbiddenProxyRequest, ssl.SSLError), 403, "forbidden", "the request is forbidden"),
            (http.ConfigurationProblem, 500, "internal_error", "internal error; it has been logged"),
            (
                http.ParseException,
                400,
                "bad_request",
                "the request could not be read: its request line or a header "
                "is malformed, or holds a character it may not",
            ),
        ):
            if isinstance(exc, kinds):
                return status, type_, message
        return 500, "internal_error", "internal error; it has been logged"


def _linger(client: socket.socket) -> None:
    """Read (and drop) what the client still sends, for a while, before gunicorn closes the connection: closing
    with unread input resets it, and the client could lose the answer before reading it."""
    client.shutdown(socket.SHUT_WR)
    client.settimeout(LINGER_S)
    deadline, read = time.monotonic() + LINGER_S, 0
    while read < LINGER_BYTES and time.monotonic() < deadline and (chunk := client.recv(65536)):
        read += len(chunk)
