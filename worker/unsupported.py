"""A model this worker cannot serve, for a reason its own message says (worker/load_error.py passes it on as it is)."""

from __future__ import annotations


class Unsupported(Exception):
    """The model cannot be served here. The message says why and what to do, in words for the one who named the
    model and for a client whose job needed it: it names no server path."""
