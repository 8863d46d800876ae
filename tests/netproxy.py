"""TCP proxies the tests can cut: the network between a worker and Redis, or between a client and the web, failing."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable


def listen(on_client: Callable[[socket.socket], None]) -> socket.socket:
    """A socket listening on 127.0.0.1 (a free port) that hands each connection to `on_client`, in the order they
    came, until it is closed."""
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            on_client(client)

    threading.Thread(target=accept, daemon=True).start()
    return listener


class Proxy:
    """Forwards 127.0.0.1:port to `upstream` (host, port). Two ways to fail:

    - `blackhole()`: bytes stop moving either way and nothing is closed; they move again on `heal()`, late (as
      after a partition, when TCP delivers what it held back), the oldest connection's first: a client sees only
      its own timeouts, and Redis gets the stale copies of what the client sent (on connections it gave up on)
      before the retry it waits on.
    - `reset()`: every connection is closed at once and new ones are refused until `heal()` (a restarted load
      balancer, a dropped NAT entry): a client sees connection errors.
    - `mute()`: what clients send still reaches the server, but its answers are lost until `heal()` (a connection
      that dies after the request went out): a client sees its own timeouts for commands that were carried out.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.flowing = threading.Event()  # new connections flow
        self.flowing.set()
        self.refusing = False
        self.muted = False
        self._links: list[threading.Event] = []  # each connection's own flow, oldest first
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener = listen(self._connect)
        self.port = self._listener.getsockname()[1]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def blackhole(self) -> None:
        self.flowing.clear()
        with self._lock:
            for link in self._links:
                link.clear()

    def reset(self) -> None:
        self.refusing = True
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open.clear()

    def mute(self) -> None:
        self.muted = True

    def heal(self) -> None:
        self.refusing = self.muted = False
        with self._lock:
            links = list(self._links)
        for link in links:  # oldest first, each a moment before the next
            link.set()
            threading.Event().wait(0.002)
        self.flowing.set()

    def close(self) -> None:
        self.reset()
        self._listener.close()

    def _connect(self, client: socket.socket) -> None:
        if self.refusing:
            client.close()
            return
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        link = threading.Event()
        if self.flowing.is_set():
            link.set()
        with self._lock:
            self._open |= {client, server}
            self._links.append(link)
        for src, dst, answers in ((client, server, False), (server, client, True)):
            threading.Thread(target=self._pump, args=(src, dst, link, answers), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, link: threading.Event, answers: bool) -> None:
        try:
            while data := src.recv(65536):
                link.wait()
                if not (answers and self.muted):
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
