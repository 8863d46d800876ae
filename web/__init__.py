"""The Flask front end. It admits jobs into Redis and reads them back; it never imports MLX."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import dramatiq
from flask import Flask, current_app

from tasks.broker import make_broker
from tasks.housekeeping import Housekeeper
from tasks.settings import Settings
from tasks.store import Store, connect
from web.feed import Hub


@dataclass(frozen=True)
class Services:
    settings: Settings
    store: Store
    broker: dramatiq.Broker
    hub: Hub  # the process's one pub/sub connection, for every open stream
    housekeeper: Housekeeper  # expires jobs on time even while no worker runs


def services() -> Services:
    return current_app.extensions["onelane"]  # type: ignore[no-any-return]


def _stored_secret(path: Path) -> str:
    """A random session-signing key kept under var/, so restarts and several web processes agree."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        secret = secrets.token_urlsafe(32)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another web process wrote it first
            return path.read_text().strip()
        with os.fdopen(fd, "w") as f:
            f.write(secret)
        return secret


def create_app(settings: Settings | None = None) -> Flask:
    """Build the app from `settings` (default: the environment)."""
    settings = settings or Settings.from_env()
    app = Flask(__name__)
    # The longest allowed prompt at 12 bytes a character (JSON writes an emoji as "\ud83d\ude00", a form as 4 %XX),
    # plus 64 KiB for the rest (stop strings, message framing); larger bodies get a 413.
    app.config["MAX_CONTENT_LENGTH"] = settings.max_prompt_chars * 12 + 64 * 1024
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.secret_key = settings.secret_key or _stored_secret(settings.var_dir / "secret_key")
    app.config.update(SESSION_COOKIE_SAMESITE="Lax", SESSION_COOKIE_HTTPONLY=True)
    store = Store(connect(settings.effective_redis_url), settings)
    broker = make_broker(settings, worker=False)
    app.extensions["onelane"] = Services(
        settings=settings, store=store, broker=broker, hub=Hub(store, settings.effective_redis_url),
        housekeeper=Housekeeper(store, broker).start(),
    )  # fmt: skip

    from web import api, docs, errors, health, openai_compat, pages, stream

    errors.register(app)
    app.register_blueprint(api.bp)
    app.register_blueprint(health.bp)
    app.register_blueprint(stream.bp)
    app.register_blueprint(openai_compat.bp)
    app.register_blueprint(pages.bp)
    app.register_blueprint(docs.bp)
    from web import dashboard  # the queue dashboard (/queue)

    app.register_blueprint(dashboard.bp)
    return app
