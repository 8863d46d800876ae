"""The Flask front end. It admits jobs into Redis and reads them back; it never imports MLX."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from flask import Flask

from tasks.grammar_check import CHECKS
from tasks.job import JobStatus
from tasks.settings import Settings
from tasks.token_count import COUNTS
from web import api, dashboard, docs, errors, health, pages, stream
from web.anthropic import messages
from web.openai.batches import file_routes as files
from web.openai.batches import routes as batches
from web.openai.batches import runner as batch_runner
from web.openai.chat import routes as chat
from web.openai.pooling import routes as pooling
from web.openai.responses import routes as responses
from web.services import EXTENSION, Services


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
    # plus 64 KiB for the rest (stop strings, message framing), plus, where a model reads images, as many as a request
    # may hold in base64; larger bodies get a 413.
    images = (
        settings.max_images * (settings.image_max_bytes * 4 // 3 + 4) if any(m.vision for m in settings.catalog) else 0
    )
    app.config["MAX_CONTENT_LENGTH"] = settings.max_prompt_chars * 12 + 64 * 1024 + images
    app.json.sort_keys = False  # type: ignore[attr-defined]  # (typed as JSONProvider; it is the DefaultJSONProvider)
    app.secret_key = settings.secret_key or _stored_secret(settings.var_dir / "secret_key")
    app.config.update(SESSION_COOKIE_SAMESITE="Lax", SESSION_COOKIE_HTTPONLY=True)
    svc = app.extensions[EXTENSION] = Services.start(settings)
    batch_runner.start(app, svc)  # feeds the batches' lines to the queue and collects their results
    CHECKS.warm()  # a grammar checker process, started before the first schema needs it
    COUNTS.warm(settings)  # a token counter, its default model's tokenizer loaded before the first prompt
    app.jinja_env.globals["ended_statuses"] = [s.value for s in JobStatus if s.ended]  # for the pages' script
    errors.register(app)
    for module in (
        api,
        health,
        stream,
        chat,
        pooling,
        responses,
        files,
        batches,
        messages,
        pages,
        docs,
        dashboard,
    ):
        app.register_blueprint(module.bp)
    return app
