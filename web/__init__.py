"""The Flask front end. It admits jobs into Redis and reads them back; it never imports MLX."""

from __future__ import annotations

from dataclasses import dataclass

import dramatiq
from flask import Flask, current_app

from tasks.broker import make_broker
from tasks.settings import Settings
from tasks.store import Store, connect


@dataclass(frozen=True)
class Services:
    settings: Settings
    store: Store
    broker: dramatiq.Broker


def services() -> Services:
    return current_app.extensions["onelane"]  # type: ignore[no-any-return]


def create_app(settings: Settings | None = None) -> Flask:
    """Build the app from `settings` (default: the environment)."""
    settings = settings or Settings.from_env()
    app = Flask(__name__)
    # Large enough for the longest allowed prompt in JSON escapes; larger bodies get a JSON 413.
    app.config["MAX_CONTENT_LENGTH"] = settings.max_prompt_chars * 6 + 64 * 1024
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions["onelane"] = Services(
        settings=settings,
        store=Store(connect(settings.effective_redis_url), settings),
        broker=make_broker(settings),
    )

    from web import api, errors, stream

    errors.register(app)
    app.register_blueprint(api.bp)
    app.register_blueprint(stream.bp)
    return app
