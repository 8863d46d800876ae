"""What the HTML pages share (the form and job pages, the dashboard, the API docs)."""

from __future__ import annotations

from flask import Blueprint, Response

from tasks.job import Job
from web.apidoc import HTML, Reply, reply

# Prompts and outputs are untrusted text: no inline script, no third-party origin, no framing.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
EXCERPT_CHARS = 80

#: With API keys configured, a browser that has not signed in is sent to sign in first (/openapi.json).
SIGN_IN = Reply("with API keys configured, a browser that has not signed in: to /login", headers={"Location": "/login"})


def webpage(description: str) -> Reply:
    """An answer that is a page of the site (/openapi.json)."""
    return reply(description, {"type": "string"}, HTML)


def excerpt(job: Job) -> str:
    """The start of the job's prompt (or last message) on one line."""
    messages = job.spec.messages or ()
    text = " ".join((job.spec.prompt if job.spec.prompt is not None else messages[-1].content).split())
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1].rstrip() + "…"


def pages_blueprint(name: str, import_name: str, headers: dict[str, str] | None = None) -> Blueprint:
    """A blueprint of HTML pages: every answer carries SECURITY_HEADERS, and `headers`."""
    bp = Blueprint(name, import_name)
    extra = {**SECURITY_HEADERS, **(headers or {})}

    @bp.after_request
    def _security_headers(response: Response) -> Response:
        response.headers.update(extra)
        return response

    return bp
