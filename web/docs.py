"""/openapi.json, and /docs: the same document as a page a person reads (server-rendered: no script, nothing from
another origin, so it works offline and under the pages' Content-Security-Policy)."""

from __future__ import annotations

import re
from typing import Any

from flask import Response, current_app, jsonify, redirect, render_template, request, url_for
from markupsafe import Markup, escape
from werkzeug.wrappers import Response as BaseResponse  # what redirect() returns (flask's Response is one)

from tasks.errors import Unauthorized
from web import openapi
from web.apidoc import documented, reply
from web.auth import current_owner, signed_in
from web.html import SIGN_IN, pages_blueprint, webpage
from web.services import services

bp = pages_blueprint("docs", __name__)

BOUNDS = {
    "minimum": "≥ {}",
    "exclusiveMinimum": "> {}",
    "maximum": "≤ {}",
    "exclusiveMaximum": "< {}",
    "minItems": "≥ {} items",
    "maxItems": "≤ {} items",
    "minLength": "length ≥ {}",
    "maxLength": "length ≤ {}",
}


def document() -> dict[str, Any]:
    """This app's OpenAPI document, built once."""
    extensions = current_app.extensions
    if "onelane_openapi" not in extensions:
        extensions["onelane_openapi"] = openapi.build(current_app, services().settings)
    return extensions["onelane_openapi"]  # type: ignore[no-any-return]  # (Flask's extensions hold Any)


@bp.before_request
def _users_only() -> BaseResponse | None:
    """With API keys configured, the document is for users, as /v1/models is (it names the served models)."""
    if request.endpoint == "docs.docs" and services().settings.keys_required and not signed_in():
        return redirect(url_for("pages.login"), code=303)
    current_owner()  # Unauthorized (401) without a key or a signed-in browser; nobody in local mode
    return None


@bp.get("/openapi.json")
@documented(
    "openapi",
    "This document (OpenAPI 3.1)",
    "docs",
    description="With API keys configured, for users only, as /v1/models: it names the served models.",
    answers={200: reply("the document", {"type": "object"})},
    errors=[Unauthorized],
)
def openapi_json() -> Response:
    return jsonify(document())


@bp.get("/docs")
@documented(
    "docsPage",
    "This document as a page",
    "docs",
    description="Rendered on the server: no script, nothing from another origin.",
    answers={200: webpage("the page"), 303: SIGN_IN},
    errors=[Unauthorized],
)
def docs() -> str:
    spec = document()
    operations = [
        (method.upper(), path, op)
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if method in openapi.METHODS
    ]
    return render_template("docs.html", spec=spec, operations=operations, schema_type=schema_type, prose=prose)


def ref_name(ref: str) -> str:
    """`#/components/schemas/Job` -> `Job`."""
    return ref.rsplit("/", 1)[-1]


def schema_type(schema: dict[str, Any]) -> Markup:
    """A schema in a few words, with links to the named schemas it uses: `array of Message | null`, `number ≤ 2`."""
    if "$ref" in schema:
        name = ref_name(schema["$ref"])
        return Markup('<a href="#schema-{0}">{0}</a>').format(name)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return Markup(" | ").join(schema_type(s) for s in schema[key])
    if "contentSchema" in schema:  # a string holding JSON (an event's data)
        return Markup("JSON ") + schema_type(schema["contentSchema"])
    if "if" in schema:  # `"[DONE]"`, else JSON
        return schema_type(schema["if"]) + Markup(" | ") + schema_type(schema.get("else", {}))
    if "properties" in schema:  # an object described in place (an event of a stream)
        fields = (Markup("{}: {}").format(name, schema_type(s)) for name, s in schema["properties"].items())
        return Markup("{") + Markup(", ").join(fields) + Markup("}")
    if "const" in schema:
        return escape(_literal(schema["const"]))
    if "enum" in schema:
        return escape(" | ".join(_literal(v) for v in schema["enum"]))
    kind = schema.get("type", "any")
    text = Markup("array of ") + schema_type(schema.get("items", {})) if kind == "array" else escape(kind)
    bounds = [rule.format(schema[key]) for key, rule in BOUNDS.items() if key in schema]
    return text + (escape(", " + ", ".join(bounds)) if bounds else Markup(""))


def prose(text: str) -> Markup:
    """A description as HTML: escaped, with `code` marked up and a paragraph per blank line."""
    html = re.sub(r"`([^`]+)`", r"<code>\1</code>", str(escape(text)))
    return Markup("".join(f"<p>{p}</p>" for p in html.split("\n\n")))


def _literal(value: Any) -> str:
    return "null" if value is None else f'"{value}"' if isinstance(value, str) else str(value).lower()
