"""The form a browser submits a job with: its fields as the API's request body (web/pages.py admits it), and as
/openapi.json describes them."""

from __future__ import annotations

import base64
from typing import Any, get_args

from werkzeug.datastructures import FileStorage, MultiDict

from tasks.errors import InvalidRequest
from tasks.job import Priority
from tasks.settings import Settings
from web.apidoc import Schema
from web.auth import session_user
from web.schemas import default_priority
from web.services import services

FORM_DEFAULTS = {"prompt": "", "max_tokens": "64", "temperature": "0", "ignore_eos": "", "raw": ""}
NUMBER_FIELDS = ("max_tokens", "temperature")
CHOICE_FIELDS = ("model", "priority")  # <select>s: sent as chosen, or left to the API's defaults when absent
PRIORITIES = {"interactive": "Interactive", "batch": "Batch (runs when no interactive job waits)"}


def form(fields: dict[str, Schema], required: list[str]) -> Schema:
    """A form's fields (/openapi.json): every form a page posts carries the session's CSRF token."""
    csrf = {"csrf_token": {"type": "string", "description": "the session's CSRF token, from the page's form"}}
    return {"type": "object", "properties": {**csrf, **fields}, "required": ["csrf_token", *required]}


def submit_form(s: Settings) -> Schema:
    """The submit form's fields, with this server's limits and models (/openapi.json)."""
    return form(
        {
            "prompt": {"type": "string", "maxLength": s.max_prompt_chars},
            "max_tokens": {
                "type": "string",
                "description": "a whole number, up to the server's limit; empty: its default",
            },
            "temperature": {"type": "string", "description": "a number from 0 to 2; empty: 0"},
            "model": {"enum": [m.name for m in s.catalog]},
            "priority": {"enum": list(get_args(Priority))},
            "ignore_eos": {"type": "string", "description": "present (any value): generate to max_tokens"},
            "image": {
                "type": "string",
                "format": "binary",
                "description": "an image to ask about (PNG, JPEG, WebP, GIF), for a model that reads images",
            },
        },
        ["prompt"],
    )


def _number(raw: str) -> int | float | str:
    """A form field as the number it spells; anything else is left for validation to refuse."""
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            continue
    return raw


def submission(form: MultiDict[str, str], files: MultiDict[str, FileStorage] | None = None) -> dict[str, Any]:
    """The form as the API's request body: numbers converted, empty fields omitted; an attached image goes before
    the question, as a chat's image part."""
    text = form.get("prompt", "")
    attached = files.get("image") if files else None
    image = attached.read() if attached is not None and attached.filename else b""
    if image and form.get("raw"):
        raise InvalidRequest("an image goes with a question to the assistant, not with text to continue", param="image")
    if image:
        url = f"data:{attached.mimetype or 'image/png'};base64,{base64.b64encode(image).decode()}"  # type: ignore[union-attr]  # (an image is attached's)
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]
        fields: dict[str, Any] = {"messages": [{"role": "user", "content": content}]}
    elif form.get("raw") or not text.strip():  # (an empty one is refused by name, as a prompt)
        fields = {"prompt": text}
    else:  # the text is the user's turn of a chat, read through the model's chat template
        fields = {"messages": [{"role": "user", "content": text}]}
    for name in NUMBER_FIELDS:
        raw = form.get(name, "").strip()
        if raw:
            fields[name] = _number(raw)
    for name in CHOICE_FIELDS:
        if form.get(name):
            fields[name] = form[name]
    if form.get("ignore_eos"):
        fields["ignore_eos"] = True
    return fields


def form_defaults() -> dict[str, str]:
    """The form as first shown: the server's default model, and the signed-in user's own priority class."""
    return {**FORM_DEFAULTS, "model": services().settings.model_name, "priority": default_priority(session_user())}
