"""Is the client still there? Checked without writing, so a waiting request notices a closed socket."""

from __future__ import annotations

import select
import socket
from typing import Any


def client_connected(environ: dict[str, Any]) -> bool:
    """False once the peer closed its end (EOF or an error); True while open or when we cannot tell."""
    sock = environ.get("gunicorn.socket") or environ.get("werkzeug.socket")
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return True
        return sock.recv(1, socket.MSG_PEEK) != b""
    except (OSError, ValueError):
        return False
