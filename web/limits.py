"""What the API's views share about what a request may ask: a list's `limit`, `order` and cursor (and how they are
documented), and how long a cancel waits for a running job to stop."""

from __future__ import annotations

from typing import Any

from flask import request

from tasks.errors import InvalidParameter

CANCEL_WAIT_S = 2.0  # a running job stops within a decode step: the cancel's answer shows it stopped
LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX = 50, 200  # ?limit= on GET /v1/jobs and OpenAI's lists

LIMIT = {
    "name": "limit",
    "in": "query",
    "description": "how many, newest first",
    "schema": {"type": "integer", "minimum": 1, "maximum": LIST_LIMIT_MAX, "default": LIST_LIMIT_DEFAULT},
}
ORDER = {"name": "order", "in": "query", "schema": {"type": "string", "enum": ["asc", "desc"]}}


def after(description: str) -> dict[str, Any]:
    """A list's cursor, `?after=`: the id of the last item the client has."""
    return {"name": "after", "in": "query", "schema": {"type": "string"}, "description": description}


def list_limit() -> int:
    """`?limit=`: how many items to list, LIST_LIMIT_DEFAULT when absent.

    Anything but one whole number from 1 to LIST_LIMIT_MAX, in plain digits, is refused (400 invalid_request, naming
    the range), never clamped or replaced by the default: a client asking for 1000 would otherwise not learn that
    it got 200. OpenAI's list endpoints refuse an out-of-range limit the same way.
    """
    given = request.args.getlist("limit")
    if not given:
        return LIST_LIMIT_DEFAULT
    digits = given[0].lstrip("0") or "0"  # leading zeros are harmless; too many digits are refused before int()
    short = digits.isascii() and digits.isdigit() and len(digits) <= len(str(LIST_LIMIT_MAX))
    if len(given) == 1 and short and 1 <= int(digits) <= LIST_LIMIT_MAX:
        return int(digits)
    raise InvalidParameter(f"limit must be given once, as a whole number from 1 to {LIST_LIMIT_MAX}", param="limit")


def oldest_first() -> bool:
    """`?order=`: `asc` lists the oldest first; `desc`, the default, the newest."""
    order = request.args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidParameter("order must be asc or desc", param="order")
    return order == "asc"
