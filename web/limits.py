"""What the API's views share about a request's bounds: how many items a list shows (`?limit=`), and how long a
cancel waits for a running job to stop."""

from __future__ import annotations

from flask import request

from tasks.errors import InvalidParameter

CANCEL_WAIT_S = 2.0  # a running job stops within a decode step: the cancel's answer shows it stopped
LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX = 50, 200  # ?limit= on GET /v1/jobs and OpenAI's lists


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
