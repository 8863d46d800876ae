"""Is the client still there? Checked without writing, so a waiting request notices a closed socket."""

from __future__ import annotations

import select
import socket
from typing import Any

# poll, not select: select() cannot watch a descriptor numbered 1024 or more (FD_SETSIZE), which a busy server
# reaches; it raised ValueError there, which read as a client gone, and a waiting client's jobs were cancelled
# (gevent's monkey-patching gives a cooperative poll)
CLOSED = select.POLLHUP | select.POLLERR | select.POLLNVAL


def client_connected(environ: dict[str, Any]) -> bool:
    """False once the peer closed its end (EOF or an error); True while open or when we cannot tell."""
    sock: socket.socket | None = environ.get("gunicorn.socket") or environ.get("werkzeug.socket")
    if sock is None:
        return True
    try:
        fd = sock.fileno()
        if fd < 0:  # closed on our side: nobody can read an answer
            return False
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        events = poller.poll(0)
        if not events:
            return True
        if events[0][1] & select.POLLIN:  # data, or EOF: peek to tell which
            return sock.recv(1, socket.MSG_PEEK) != b""
        return not events[0][1] & CLOSED
    except OSError:
        return False
