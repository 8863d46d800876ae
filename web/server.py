"""Serve the Flask app with gunicorn, configured in code (no config file to keep in sync)."""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication

from tasks.settings import Settings
from web import create_app

logger = logging.getLogger(__name__)


class _Gunicorn(BaseApplication):  # type: ignore[misc]
    def __init__(self, app: Flask, options: dict[str, Any]) -> None:
        self.application = app
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Flask:
        return self.application


def serve(settings: Settings, host: str, port: int, threads: int = 64) -> None:
    """One gunicorn worker process with `threads` threads: each open event stream holds a thread."""
    app = create_app(settings)
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        logger.warning("listening on %s: anyone who can reach it can submit jobs", host)
    options = {
        "bind": f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
        "workers": 1,
        "worker_class": "gthread",
        "threads": threads,
        "timeout": 60,
        "graceful_timeout": 10,
        "accesslog": "-",
        "loglevel": "info",
    }
    _Gunicorn(app, options).run()
