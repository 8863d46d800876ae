"""Who is asking, decided once per request.

- `Authorization: Bearer <key>`: the user that key belongs to (401 for a wrong key). With no keys
  configured (single-user local mode) any bearer key is the local user, so OpenAI clients just work.
- A browser: its signed session cookie. In local mode each browser is a visitor of its own
  (`web-<random>`); with keys configured a browser signs in once with a key (`/login`).
- Neither: the local user in local mode, else 401.

Requests that act on a cookie (not a bearer key) and change something must carry the session's CSRF token
(form field `csrf_token` or header `X-CSRF-Token`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from flask import g, request, session

from tasks.errors import Unauthorized
from tasks.settings import User
from web import services

LOCAL_USER = "local"
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def user_for_key(key: str) -> User | None:
    """The user owning `key`, compared in constant time."""
    digest = _digest(key)
    found = None
    for user in services().settings.users:
        if hmac.compare_digest(digest, _digest(user.key)):
            found = user
    return found


def current_user() -> User | None:
    """The configured user behind this request, if any (None in local mode)."""
    current_owner()
    return g.get("onelane_user")


def current_owner() -> str:
    """The owner name of this request's jobs; raises Unauthorized."""
    if "onelane_owner" not in g:
        g.onelane_owner, g.onelane_user = _identify()
    return str(g.onelane_owner)


def _identify() -> tuple[str, User | None]:
    settings = services().settings
    header = request.headers.get("Authorization")
    if header:
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthorized("send your API key as 'Authorization: Bearer <key>'")
        if not settings.keys_required:
            return LOCAL_USER, None
        user = user_for_key(key.strip())
        if user is None:
            raise Unauthorized("invalid API key")
        return user.name, user
    if "user" in session:
        user = next((u for u in settings.users if u.name == session["user"]), None)
        if user is not None:
            _check_csrf()
            return user.name, user
    if not settings.keys_required:
        if "visitor" in session:
            _check_csrf()
            return str(session["visitor"]), None
        return LOCAL_USER, None
    raise Unauthorized("this server needs an API key: send 'Authorization: Bearer <key>'")


def start_visit() -> None:
    """Give a browser its own identity in local mode, and a CSRF token in any mode."""
    if not services().settings.keys_required and "user" not in session:
        session.setdefault("visitor", "web-" + secrets.token_urlsafe(9))
    session.setdefault("csrf", secrets.token_urlsafe(24))
    session.permanent = True


def sign_in(key: str) -> User | None:
    """Bind this browser's session to the user owning `key`."""
    user = user_for_key(key)
    if user is not None:
        session.clear()
        session["user"] = user.name
        start_visit()
    return user


def signed_in() -> bool:
    """This browser's session belongs to a configured user."""
    return any(u.name == session.get("user") for u in services().settings.users)


def csrf_token() -> str:
    start_visit()
    return str(session["csrf"])


def _check_csrf() -> None:
    if request.method not in UNSAFE_METHODS:
        return
    sent = request.headers.get("X-CSRF-Token") or request.form.get("csrf_token") or ""
    if not hmac.compare_digest(sent, str(session.get("csrf", ""))):
        raise Unauthorized("missing or wrong CSRF token; reload the page and try again")
