"""Who is asking, decided once per request.

- `Authorization: Bearer <key>` (or `x-api-key: <key>`, as Anthropic's clients send it): the user that key belongs
  to (401 for a wrong key). With no keys
  configured (single-user local mode) any bearer key is the local user, so OpenAI clients just work.
- A browser: its signed session cookie. In local mode each browser is a visitor of its own
  (`web-<random>`), and the visitors of one client address share a quota (visitor_address); with keys configured
  a browser signs in once with a key (`/login`).
- Neither: the local user in local mode, else 401.

A request that changes something and carries no bearer key is checked by check_csrf(), the one CSRF rule.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from flask import g, request, session

from tasks.errors import Forbidden, Unauthorized
from tasks.users import User
from web import body
from web.services import services

LOCAL_USER = "local"
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
OTHER_SITES = frozenset({"cross-site", "same-site"})  # Sec-Fetch-Site of a request another site's page made


def same_secret(sent: str, expected: str) -> bool:
    """Compare two secrets in constant time, as bytes: whatever text a client sends compares, never raises."""
    return hmac.compare_digest(_bytes(sent), _bytes(expected))


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # any str encodes (compare_digest takes only ASCII str)


def _digest(key: str) -> bytes:
    return hashlib.sha256(_bytes(key)).digest()


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
    user: User | None = g.get("onelane_user")
    return user


def current_owner() -> str:
    """The owner name of this request's jobs; raises Unauthorized."""
    if "onelane_owner" not in g:
        g.onelane_owner, g.onelane_user = _identify()
    return str(g.onelane_owner)


def visitor_address() -> str | None:
    """In local mode, a browser visitor's client address: the visitors of one address share one user's quota and
    a few turns (tasks/lua/admit.lua), however many identities it mints. Never X-Forwarded-For, which anyone can
    write: behind a proxy all visitors have the proxy's address (a shared deployment uses API keys)."""
    owner = current_owner()
    if services().settings.keys_required or owner == LOCAL_USER:
        return None
    return request.remote_addr or "unknown"


def _identify() -> tuple[str, User | None]:
    settings = services().settings
    header = request.headers.get("Authorization")
    if not header and request.headers.get("X-Api-Key"):  # Anthropic's clients send their key so
        header = f"Bearer {request.headers['X-Api-Key']}"
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
    check_csrf()
    user = session_user()
    if user is not None:
        return user.name, user
    if not settings.keys_required:
        return str(session.get("visitor", LOCAL_USER)), None
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


def session_user() -> User | None:
    """The configured user this browser's session is signed in as, if any."""
    return services().settings.user_named(str(session.get("user", "")))


def signed_in() -> bool:
    """This browser's session belongs to a configured user."""
    return session_user() is not None


def csrf_token() -> str:
    start_visit()
    return str(session["csrf"])


def check_csrf() -> None:
    """The one CSRF rule, for a request without a bearer key that would change something (refused: Forbidden).

    Another site's page may change nothing (Sec-Fetch-Site). A request that carries a browser session, or that a
    page could send from anywhere without a CORS preflight (a POST of a form or of plain text), must carry the
    session's CSRF token (form field `csrf_token` or header `X-CSRF-Token`); with no session it cannot. What is
    left, a JSON POST or a DELETE with no cookie (curl, the SDKs), needs none: browsers send those cross-site
    only after a preflight, which this server never grants.
    """
    if request.method not in UNSAFE_METHODS:
        return
    if request.headers.get("Sec-Fetch-Site", "").lower() in OTHER_SITES:
        raise Forbidden("a request from another site may not change anything here")
    expected = session.get("csrf")
    if expected is None and (request.method != "POST" or request.is_json):
        return
    sent = request.headers.get("X-CSRF-Token") or body.form(request).get("csrf_token") or ""
    if expected is None or not same_secret(sent, str(expected)):
        raise Forbidden("missing or wrong CSRF token; reload the page and try again")
