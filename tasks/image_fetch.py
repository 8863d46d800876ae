"""An image URL fetched at the door (tasks/images.py), from the hosts an operator lists (ONELANE_IMAGE_HOSTS) only.

A server that fetches the URLs its clients name is a door into the network it sits in (SSRF), so a fetch is exactly
what was checked, once:
- the URL is read once (`Target`), and what is sent is what was read: a URL holding a backslash, whitespace, a control
  or non-ASCII character, or a user name (`user@host`), which parsers read differently, is refused outright;
- its host must be one the operator lists, by name;
- the name is resolved here, and every address it resolves to must be a public one (not loopback, private,
  link-local, shared, reserved, multicast or unspecified; an IPv4 address in any spelling, or mapped into IPv6, is
  read as the address it is). ONELANE_IMAGE_PRIVATE_HOSTS lets a listed host be a private one (an operator's own
  image server on its network), never a multicast or unspecified one;
- the connection goes to the address checked (no second look-up the answer of which could differ: no DNS rebinding),
  with the name as its Host and, for https, as the name its certificate is checked against (SNI);
- no redirect is followed (only a 200 is read), nothing is decompressed, at most the byte limit is read, and the
  whole fetch (look-up, connection, every read) has one deadline: a server dripping a byte a second is cut there.
What went wrong is logged; the client is told that the image could not be fetched, never what was reached (an
address, a port, a status).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tasks.errors import InvalidRequest, PromptTooLarge

logger = logging.getLogger(__name__)

CHUNK = 65536
NOT_FETCHED = "the image URL could not be fetched; send the image inline, as a data: URL (data:image/png;base64,…)"
_HOST = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?")  # a name or an IPv4 address, in any of its spellings
_PORTS = {"http": 80, "https": 443}


class Refused(Exception):
    """A fetch that went wrong past the URL's checks: its reason is logged, never told to the client."""


@dataclass(frozen=True)
class Target:
    """A URL as it was read once: what is checked and what is fetched."""

    scheme: str
    host: str  # lowercase, without a trailing dot; an IPv6 address without its brackets
    port: int
    path: str  # the path and query, sent as they came

    @property
    def host_header(self) -> str:
        name = f"[{self.host}]" if ":" in self.host else self.host
        return name if self.port == _PORTS[self.scheme] else f"{name}:{self.port}"


def target(url: str, param: str) -> Target:
    """The URL read once, or InvalidRequest naming what a URL to fetch may not hold."""
    if any(c == "\\" or c.isspace() or not " " < c < "\x7f" for c in url):
        raise InvalidRequest(
            "an image URL may not hold a backslash, whitespace, control or non-ASCII characters (percent-encode them)",
            param=param,
        )
    split = urlsplit(url)
    scheme = split.scheme.lower()
    if scheme not in _PORTS:
        raise InvalidRequest("an image URL is http(s), or a data: URL", param=param)
    if "@" in split.netloc:
        raise InvalidRequest("an image URL may not hold a user name or password (user@host)", param=param)
    try:
        port = split.port if split.port is not None else _PORTS[scheme]
    except ValueError:  # (not a number, or past 65535)
        port = 0
    if not port:
        raise InvalidRequest("the image URL's port is not a number from 1 to 65535", param=param)
    host = (split.hostname or "").rstrip(".")
    if not (_HOST.fullmatch(host) or _ipv6(host)):
        raise InvalidRequest("the image URL names no host (a name, or an address)", param=param)
    path = split.path or "/"
    return Target(scheme, host, port, path + (f"?{split.query}" if split.query else ""))


def fetch(url: Target, max_bytes: int, within_s: float, private: bool, param: str) -> bytes:
    """The bytes at `url` (its host already allowed), within `within_s` in all; PromptTooLarge past `max_bytes`,
    InvalidRequest (NOT_FETCHED) for anything else that goes wrong (why is logged)."""
    deadline = time.monotonic() + within_s
    try:
        addresses = _resolve(url, deadline)
        for address in addresses:
            if why := refused_address(address, private):
                raise Refused(f"{url.host} resolves to {address}: {why}")
        return _get(url, addresses, deadline, max_bytes)
    except PromptTooLarge:
        raise
    except Refused as exc:
        logger.info("an image URL was not fetched: %s", exc)
    except Exception as exc:  # (a connection refused or reset, a certificate, a protocol error...)
        logger.info("an image URL of %s was not fetched: %s", url.host, exc)
    raise InvalidRequest(NOT_FETCHED, param=param) from None


def refused_address(address: str, private: bool = False) -> str:
    """Why an image may not be fetched from `address` ("" if it may): an IPv4 address mapped into IPv6, or in 6to4,
    is read as the IPv4 address it carries."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        ip = ip.ipv4_mapped or ip.sixtofour or ip
    if ip.is_multicast or ip.is_unspecified:
        return "a multicast or unspecified address"
    if not private and not ip.is_global:
        return "not a public address (loopback, private, link-local, shared or reserved)"
    return ""


def _resolve(url: Target, deadline: float) -> list[str]:
    """The addresses `url`'s host resolves to (in the order to try them), looked up within the deadline (in a thread:
    a look-up takes no timeout; under gevent, the web's, it is the resolver's cooperative one)."""
    found: list[Any] = []
    done = threading.Event()

    def look() -> None:
        try:
            found.append(socket.getaddrinfo(url.host, url.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP))
        except OSError as exc:
            found.append(exc)
        finally:
            done.set()

    threading.Thread(target=look, name="image-url-lookup", daemon=True).start()
    if not done.wait(max(0.0, deadline - time.monotonic())):
        raise Refused(f"{url.host} was not resolved in time")
    if isinstance(found[0], OSError):
        raise Refused(f"{url.host} was not resolved: {found[0]}")
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found[0]))
    if not addresses:
        raise Refused(f"{url.host} resolves to no address")
    return addresses


def _get(url: Target, addresses: list[str], deadline: float, max_bytes: int) -> bytes:
    from urllib3.connection import HTTPConnection, HTTPSConnection

    last: Exception | None = None
    for address in addresses:  # (the first that answers)
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if url.scheme == "https":  # the name, not the address, is what its certificate must be for
            conn: HTTPConnection = HTTPSConnection(address, url.port, timeout=left, server_hostname=url.host)
        else:
            conn = HTTPConnection(address, url.port, timeout=left)
        with _Watchdog(conn, deadline) as watchdog:
            try:
                conn.connect()
            except OSError as exc:
                last = exc
                conn.close()
                continue
            watchdog.sock = conn.sock  # (the response reads it on after the connection lets go of it)
            try:
                return _read(conn, url, deadline, max_bytes)
            finally:
                conn.close()
    raise Refused(f"no connection to {url.host} ({last or 'no time left'})")


def _read(conn: Any, url: Target, deadline: float, max_bytes: int) -> bytes:
    headers = {"Host": url.host_header, "Accept": "image/*", "Accept-Encoding": "identity", "User-Agent": "onelane"}
    conn.request("GET", url.path, headers=headers, preload_content=False, decode_content=False)
    reply = conn.getresponse()
    if reply.status != 200:
        raise Refused(f"{url.host} answered HTTP {reply.status}")
    if reply.headers.get("Content-Encoding", "identity").lower() != "identity":
        raise Refused(f"{url.host} sent the image compressed ({reply.headers['Content-Encoding']})")
    length = reply.headers.get("Content-Length", "")
    if length.isdigit() and int(length) > max_bytes:
        raise _too_large(max_bytes)
    data = bytearray()
    while True:
        _past(deadline, url)
        chunk = reply.read(CHUNK)
        _past(deadline, url)  # (a read the deadline cut short ends early: its bytes are not the image)
        if not chunk:
            return bytes(data)
        data += chunk
        if len(data) > max_bytes:
            raise _too_large(max_bytes)


def _past(deadline: float, url: Target) -> None:
    if time.monotonic() >= deadline:
        raise Refused(f"{url.host} did not send the image in time")


def _too_large(max_bytes: int) -> PromptTooLarge:
    return PromptTooLarge(f"the image at the URL has more than {max_bytes} bytes; this server takes at most that")


class _Watchdog:
    """Shuts the connection's socket at the deadline, whatever it waits for then (a connection, a TLS handshake, a
    read each of whose bytes comes just in time): a bound on the whole fetch, not on each read."""

    def __init__(self, conn: Any, deadline: float) -> None:
        self.conn = conn
        self.sock: socket.socket | None = None
        self.timer = threading.Timer(max(0.0, deadline - time.monotonic()), self.cut)
        self.timer.daemon = True

    def __enter__(self) -> _Watchdog:
        self.timer.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.timer.cancel()

    def cut(self) -> None:
        for sock in {id(s): s for s in (self.conn.sock, self.sock) if s is not None}.values():
            with contextlib.suppress(OSError):  # (closed already)
                sock.shutdown(socket.SHUT_RDWR)


def _ipv6(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False
