"""Who is asking. Single-user local mode for now: every caller is the local user."""

from __future__ import annotations

LOCAL_USER = "local"


def current_owner() -> str:
    return LOCAL_USER
