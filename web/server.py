"""Serve the Flask app with gunicorn, configured in code (no config file to keep in sync).

gevent workers: an open event stream costs a greenlet, not a thread, so one process holds hundreds of
waiting clients. The app is built in each worker after gevent has patched the standard library. What gunicorn
refuses before the app sees it is answered in JSON too (web/gevent_worker.py).
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication

from tasks.settings import Settings

logger = logging.getLogger(__name__)


class _Gunicorn(BaseApplication):  # type: ignore[misc]  # (gunicorn is untyped: BaseApplication is Any)
    def __init__(self, settings: Settings, options: dict[str, Any]) -> None:
        self.settings = settings
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Flask:
        from web import create_app

        return create_app(self.settings)


def serve(settings: Settings, host: str, port: int, workers: int = 1, connections: int = 1000) -> None:
    """gunicorn with `workers` gevent processes of up to `connections` open connections each."""
    _raise_open_files_limit()
    if not settings.keys_required and not _loopback(host):
        logger.warning(
            "listening on %s without API keys (ONELANE_API_KEYS): anyone who can reach it can submit jobs", host
        )
    options = {
        "bind": f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
        "workers": workers,
        "worker_class": "web.gevent_worker.JsonErrorsWorker",  # gevent; its own refusals are JSON too
        "worker_connections": connections,
        "timeout": 60,
        "graceful_timeout": 10,
        "keepalive": 5,
        "accesslog": None,
        "loglevel": "info",
        "control_socket_disable": True,
    }
    _Gunicorn(settings, options).run()


def _raise_open_files_limit() -> None:
    """An open stream holds ~3 file descriptors (client, pub/sub, a pooled Redis connection): lift the soft
    limit (often 1024) to the hard one."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
