"""A waiting request asks whether its client is still there (web/connection.py): a wrong "gone" cancels the
client's jobs, so the answer must hold on a busy server too."""

from __future__ import annotations

import fcntl
import socket

from web.connection import client_connected


def _numbered_from(sock: socket.socket, lowest: int) -> socket.socket:
    """The same connection, under a descriptor numbered `lowest` or more."""
    return socket.socket(fileno=fcntl.fcntl(sock.fileno(), fcntl.F_DUPFD, lowest))


def test_a_client_is_there_until_it_closes_and_data_it_sent_does_not_count_as_leaving() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert client_connected({"werkzeug.socket": ours})
        theirs.sendall(b"x")
        assert client_connected({"werkzeug.socket": ours})
        assert ours.recv(1) == b"x"
        theirs.close()
        assert not client_connected({"werkzeug.socket": ours})


def test_a_client_on_a_descriptor_past_1024_is_still_there() -> None:
    # a busy server's sockets are numbered past select()'s FD_SETSIZE: such a client read as gone, and its
    # request's jobs were cancelled under it (seen as a 499 in a test late in the suite)
    ours, theirs = socket.socketpair()
    with ours, theirs, _numbered_from(ours, 1500) as high:
        assert client_connected({"gunicorn.socket": high})
        theirs.close()
        assert not client_connected({"gunicorn.socket": high})


def test_without_a_socket_to_look_at_the_client_counts_as_there() -> None:
    assert client_connected({})
