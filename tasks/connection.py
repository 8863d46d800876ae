"""How onelane's processes connect to Redis: one client per process, with deliberate timeouts."""

from __future__ import annotations

from typing import Any

import redis

MAX_CONNECTIONS = 10_000  # every open event stream holds one (pub/sub); redis-py's default pool stops at 100


def connect(url: str, timeout_s: float | None = None) -> redis.Redis:
    """A client for onelane's Redis, decoding replies as text. A call that gets no answer within `timeout_s`
    (ONELANE_REDIS_TIMEOUT_S) fails rather than hang on a connection that went silent; TCP keepalive finds a dead
    idle one."""
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        health_check_interval=10,
        max_connections=MAX_CONNECTIONS,
        **timeouts(url, timeout_s),
    )


def timeouts(url: str, timeout_s: float | None, blocking_s: float = 0) -> dict[str, Any]:
    """A Redis client's timeouts: `timeout_s` to connect, and to read a reply (plus `blocking_s` for a client whose
    commands block on purpose); over TCP, keepalive too."""
    read_s = None if timeout_s is None else timeout_s + blocking_s
    options: dict[str, Any] = {"socket_timeout": read_s, "socket_connect_timeout": timeout_s}
    if not url.startswith("unix://"):  # a unix socket has no keepalive
        options["socket_keepalive"] = True
    return options
