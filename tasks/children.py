"""Work done away from the web's own process: in child processes, each answering one request at a time over a
socket, with a time bound, a memory cap, and a new process when one dies or overruns.

Two things make such work worth a process. Native code (llguidance, an image decoder) that crashes or runs away must
cost one request its 400, not every stream of the web process its end. And CPU-heavy work must not hold the web's
gevent loop: here the web only waits on a socket, which lets every other request and stream of the process go on.

A child is a module run as `python -m MODULE FD` that calls `serve(handle)`: `handle(header, payload)` answers one
request (a JSON object and bytes) with another. `Children` keeps up to `size` of them per web process (started when
first needed, again after a fork); a request that finds every one busy for `wait_s` is a 503 with Retry-After
(`Overloaded`, the pool's own class of it), and one that takes more than `answer_s` (its whole exchange: writing,
working, reading) is `Overran`, its child killed.

The wire: a JSON header line whose "size" says how many bytes of payload follow it, both ways.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tasks.errors import Overloaded

logger = logging.getLogger(__name__)

START_S = 30.0  # a child's start (Python and its imports), at most, on a loaded machine

Handler = Callable[[dict[str, Any], bytes], tuple[dict[str, Any], bytes]]


class Overran(Exception):
    """A child took longer than its bound to answer; it was killed (and the next request starts another)."""


class Crashed(Exception):
    """A child died answering (its native code crashed, or it met its memory cap)."""


@dataclass(frozen=True)
class ChildKind:
    """A kind of child: its module, and its bounds."""

    module: str  # run as `python -m module FD`
    name: str  # as logs and errors name it ("grammar checker", "image reader")
    size: int = 2  # processes per web process, each answering one request at a time
    answer_s: float = 5.0  # one request's exchange, at most
    wait_s: float = 10.0  # waiting for a free child, at most
    busy: type[Overloaded] = Overloaded  # what a request that waited wait_s in vain raises


class Child:
    """One child process and the socket to it."""

    def __init__(self, kind: ChildKind) -> None:
        ours, theirs = socket.socketpair()
        self.kind = kind
        self.process = subprocess.Popen(
            [sys.executable, "-m", kind.module, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # (a Ctrl-C in the terminal stops the web, which closes the socket: it ends then)
        )
        theirs.close()
        self.sock = ours
        self.started = False

    def ask(self, header: dict[str, Any], payload: bytes = b"") -> tuple[dict[str, Any], bytes] | None:
        """The child's answer; None if it died meanwhile; TimeoutError past the kind's bound (plus START_S the
        first time), counted over the whole exchange, not each read."""
        deadline = time.monotonic() + self.kind.answer_s + (0 if self.started else START_S)
        try:
            _send(self.sock, header, payload, deadline)
            answer = _receive(self.sock, deadline)
        except (BrokenPipeError, ConnectionResetError):
            return None
        self.started = True
        return answer

    def stop(self) -> None:
        self.process.kill()
        self.sock.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # (a kill is not refused; the process table is busy)
            logger.warning("%s %d did not end within 5 s of its kill", self.kind.name, self.process.pid)


class Children:
    """The child processes of one kind in this process (started when first needed, again after a fork)."""

    def __init__(self, kind: ChildKind) -> None:
        self.kind = kind
        self._lock = threading.Lock()
        self._reset()
        atexit.register(self.close)

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._idle: list[Child] = []
        self._slots = threading.BoundedSemaphore(self.kind.size)
        self.asked = 0  # requests that went to a child

    def ask(self, header: dict[str, Any], payload: bytes = b"") -> tuple[dict[str, Any], bytes]:
        """A child's answer to one request; the kind's `busy` error if none is free in time, `Overran` past the
        kind's bound, `Crashed` if the child died answering."""
        if self._pid != os.getpid():  # a forked child: the processes are the parent's
            self._reset()
        self.asked += 1
        kind = self.kind
        if not self._slots.acquire(timeout=kind.wait_s):
            raise kind.busy(
                f"every {kind.name} of the server is busy with other requests", retry_after_s=int(kind.wait_s)
            )
        try:
            with self._lock:
                child = self._idle.pop() if self._idle else None
            child = child or Child(kind)
            began = time.monotonic()
            try:
                answer = child.ask(header, payload)
            except TimeoutError:
                child.stop()
                logger.warning("a request took its %s over %.1f s; it was started again", kind.name, kind.answer_s)
                raise Overran(f"it takes more than {kind.answer_s:g} s") from None
            if answer is None:
                child.stop()
                code = child.process.returncode
                logger.warning(
                    "a request crashed its %s (exit %s) after %.2f s", kind.name, code, time.monotonic() - began
                )
                raise Crashed(f"it crashed the {kind.name}")
            with self._lock:
                self._idle.append(child)
            return answer
        finally:
            self._slots.release()

    def warm(self, header: dict[str, Any], payload: bytes = b"") -> None:
        """Start a child now, in the background, asking it `header`: the first real request does not wait for it."""

        def ask() -> None:
            try:
                self.ask(header, payload)
            except Exception:  # (the real request will say what is wrong)
                logger.exception("warming a %s failed", self.kind.name)

        threading.Thread(target=ask, name=f"warm-{self.kind.module}", daemon=True).start()

    def close(self) -> None:
        """Stop the idle children (at exit; a busy one ends when its socket closes)."""
        if self._pid != os.getpid():
            return
        with self._lock:
            idle, self._idle = self._idle, []
        for child in idle:
            child.stop()


def serve(handle: Handler, memory_bytes: int | None = None, cpu_s: int | None = None) -> None:
    """A child's main: answer requests on the socket of file descriptor argv[1] with `handle` until it closes, its
    address space capped at `memory_bytes` and each request's CPU time at `cpu_s` (past it the kernel kills the
    process: the web sees the socket close)."""
    if memory_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    with socket.socket(fileno=int(sys.argv[1])) as sock:
        sock.setblocking(True)  # (under gevent, the parent made both ends of the pair non-blocking)
        while (request := _receive(sock, None)) is not None:
            if cpu_s is not None:  # (a budget per request: the process's CPU time so far, plus this one's)
                used = resource.getrusage(resource.RUSAGE_SELF)
                limit = int(used.ru_utime + used.ru_stime) + cpu_s
                hard = resource.getrlimit(resource.RLIMIT_CPU)[1]  # (a hard limit, once lowered, cannot rise again:
                # the soft one's SIGXCPU ends the process, as its default action)
                soft = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
                resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
            header, payload = handle(*request)
            _send(sock, header, payload, None)


def _send(sock: socket.socket, header: dict[str, Any], payload: bytes, deadline: float | None) -> None:
    data = json.dumps({**header, "size": len(payload)}).encode() + b"\n" + payload
    _timeout(sock, deadline)
    view = memoryview(data)
    while view:
        _timeout(sock, deadline)
        sent = sock.send(view)
        view = view[sent:]


def _receive(sock: socket.socket, deadline: float | None) -> tuple[dict[str, Any], bytes] | None:
    """One message: its header and its payload; None if the other end closed before one began."""
    buffer = bytearray()
    while b"\n" not in buffer:
        _timeout(sock, deadline)
        chunk = sock.recv(65536)
        if not chunk:
            if buffer:
                raise ConnectionResetError("the other end closed within a message")
            return None
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    header = json.loads(line)
    size = int(header.pop("size"))
    payload = bytearray(rest)
    while len(payload) < size:
        _timeout(sock, deadline)
        chunk = sock.recv(min(1 << 20, size - len(payload)))
        if not chunk:
            raise ConnectionResetError("the other end closed within a message")
        payload += chunk
    return header, bytes(payload)


def _timeout(sock: socket.socket, deadline: float | None) -> None:
    """The socket's timeout: what is left until `deadline` (TimeoutError once none is)."""
    if deadline is None:
        sock.settimeout(None)
        return
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    sock.settimeout(left)
