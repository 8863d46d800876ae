"""A request's body, read in one place: once, and never past the server's limit (MAX_CONTENT_LENGTH)."""

from __future__ import annotations

from flask import Request
from werkzeug.datastructures import MultiDict
from werkzeug.exceptions import RequestEntityTooLarge


def raw(request: Request) -> bytes:
    """The whole body; RequestEntityTooLarge (413) if it is larger than the limit, however it was sent."""
    data = request.get_data(cache=True)
    limit = request.max_content_length
    # A body with a Content-Length over the limit is refused before it is read. One without (chunked) is read
    # up to the limit, and Werkzeug then stops without a word: a body that filled the limit may have gone on.
    if limit is not None and request.content_length is None and len(data) >= limit:
        raise RequestEntityTooLarge()
    return data


def form(request: Request) -> MultiDict[str, str]:
    """The form fields, parsed from the body as raw() read it (so with the same limit)."""
    raw(request)
    return request.form
