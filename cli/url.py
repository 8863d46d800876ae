"""Where the terminal client finds the web: ONELANE_URL when it is set; else the web that `onelane up` runs from this
folder, which `up` records in its var folder (ONELANE_VAR_DIR, default ./var) as web.json for as long as it runs;
else http://127.0.0.1:8000.

The client sends its API key and its prompts wherever the record points, so it trusts only a record that this user's
own `up` wrote: a regular file owned by this user that no one else can write (up writes it 0600), in a folder no one
else can write, naming a loopback URL, and the pid of a live `onelane up` of this user started when the record says.
Any other record (a checkout or a shared folder may ship one) is ignored, said in one line on stderr, and the client
calls the default as if there were none.

A record outlives an `up` killed outright. A record whose up has ended (its pid gone, or given to a later process) is
refused at once, saying so and what to do, before any request: never a wait on a port that nobody (or somebody else)
serves now, and never a silent fall back to 127.0.0.1:8000, which may be another onelane than the one this folder ran.
"""

from __future__ import annotations

import errno
import grp
import ipaddress
import json
import os
import pwd
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cli.process import Unknown, describe
from tasks.settings import ENV_NAMES, Settings

DEFAULT_URL = "http://127.0.0.1:8000"
RECORD = "web.json"
MAX_RECORD_BYTES = 4096  # a record is one short line; a planted file may be anything


class StaleRecord(Exception):
    """The record of `onelane up` in the var folder is of one that has ended (or is unreadable)."""


class Untrusted(Exception):
    """The record is not one this user's own `onelane up` wrote, or others could have changed it: it is ignored."""


@dataclass(frozen=True)
class Found:
    """The web's base URL, and how it was found (said in the client's errors)."""

    url: str
    how: str


def find(environ: Mapping[str, str] = os.environ) -> Found:
    """ONELANE_URL, else the `onelane up` of ONELANE_VAR_DIR, else the default; StaleRecord if that up has ended.
    A record this user's up did not write is ignored, said on stderr."""
    if environ.get("ONELANE_URL"):
        return Found(environ["ONELANE_URL"], "ONELANE_URL")
    path = Path(environ.get(ENV_NAMES["var_dir"]) or Settings.model_fields["var_dir"].default) / RECORD
    try:
        url, pid = _trusted(path)
    except FileNotFoundError:
        return Found(DEFAULT_URL, "the default: start onelane with `onelane up`, or set ONELANE_URL to where it runs")
    except Untrusted as exc:
        said = f"onelane: ignoring {path}, not a record of your own onelane up: {exc}; calling {DEFAULT_URL}"
        print(said, file=sys.stderr)
        return Found(DEFAULT_URL, f"the default, {path} being ignored; set ONELANE_URL to where onelane runs")
    return Found(url, f"onelane up's, pid {pid}, from {path}; ONELANE_URL overrides it")


def record(path: Path, host: str, port: int) -> None:
    """Record this process's web at host:port for the client, readable by this user alone; written whole or not at
    all (a rename)."""
    if host in ("0.0.0.0", "::", ""):  # listening everywhere: this machine reaches it on loopback
        host = "127.0.0.1" if host != "::" else "::1"
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    try:
        me = describe(os.getpid())
    except Unknown:
        me = None  # the client cannot tell either: it ignores the record, saying why
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with open(descriptor, "w") as file:
        os.fchmod(descriptor, 0o600)  # (a file left by an earlier attempt kept its mode)
        file.write(json.dumps({"url": url, "pid": os.getpid(), "started": me and me.started}) + "\n")
    partial.replace(path)


def forget(path: Path) -> None:
    """Remove the record if it is still this process's (another `up` may have recorded its own since)."""
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def _trusted(path: Path) -> tuple[str, int]:
    """The URL and pid of the record at `path`, once shown to be this user's up's; FileNotFoundError when there is
    none, Untrusted or StaleRecord when it may not be used."""
    recorded = _read(path)
    try:
        url, pid, started = str(recorded["url"]), int(recorded["pid"]), recorded.get("started")
        host = urlsplit(url).hostname
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _unreadable(path, exc) from None
    if not _loopback(host):
        raise Untrusted(f"it names {url}, not this machine's loopback (set ONELANE_URL to it if you mean it)")
    ended = StaleRecord(
        f"the onelane up that served {url} from here (pid {pid}, recorded in {path}) has ended: start it again "
        f"with `onelane up`, or set ONELANE_URL to the server you mean (then {path} is not read)"
    )
    _check_up(pid, started, ended)
    return url, pid


def _read(path: Path) -> dict[str, Any]:
    """The record's content, read from a regular file that this user owns and only this user can change."""
    try:  # opened first, then checked: what is checked is what is read (no symbolic link, no FIFO to hang on)
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Untrusted("it is a symbolic link") from None
        raise _unreadable(path, exc.strerror) from None
    with open(descriptor, "rb") as file:
        mine = os.fstat(descriptor)
        if not stat.S_ISREG(mine.st_mode):
            raise Untrusted("it is not a regular file")
        _check_owned(mine, "it", private_group=False)  # up writes it 0600
        _check_owned(os.stat(path.parent), "its folder", private_group=True)
        text = file.read(MAX_RECORD_BYTES)
    try:
        recorded = json.loads(text)
    except ValueError as exc:
        raise _unreadable(path, exc) from None
    if not isinstance(recorded, dict):
        raise _unreadable(path, "not an object")
    return recorded


def _unreadable(path: Path, why: object) -> StaleRecord:
    return StaleRecord(f"{path} is unreadable ({why}): remove it, or set ONELANE_URL to the server's URL")


def _check_owned(status: os.stat_result, what: str, private_group: bool) -> None:
    """Untrusted unless this user owns it and no one else can write it; with `private_group`, a group write by this
    user's own group (what a umask of 002 gives new folders) is no one else's."""
    if status.st_uid != os.getuid():
        raise Untrusted(f"{what} belongs to uid {status.st_uid}, not to you (uid {os.getuid()})")
    others = stat.S_IWOTH | (0 if private_group and _own_group(status.st_gid) else stat.S_IWGRP)
    if status.st_mode & others:
        raise Untrusted(f"others can write {what} (mode {stat.S_IMODE(status.st_mode):o})")


def _own_group(gid: int) -> bool:
    """Whether gid is this user's private group: named as the user, the user's primary one, with no other member."""
    try:
        group, user = grp.getgrgid(gid), pwd.getpwuid(os.getuid())
    except KeyError:
        return False
    return gid == user.pw_gid and group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def _loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def _check_up(pid: int, started: object, ended: StaleRecord) -> None:
    """Untrusted unless pid is a live `onelane up` of this user started when the record says; `ended` when the
    process the record names runs no more."""
    if pid <= 0:  # (kill(0) and kill(-1) would reach whole groups)
        raise Untrusted(f"pid {pid} is no process")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise ended from None
    except PermissionError:
        raise Untrusted(f"pid {pid} is another user's process") from None
    if not isinstance(started, str):
        raise Untrusted("it does not say when its up started (an older onelane's? start onelane up again)")
    try:
        process = describe(pid)
    except Unknown as exc:
        raise Untrusted(f"this system does not say what pid {pid} runs: {exc}") from None
    if process is None or process.started != started:
        raise ended  # the pid was given to a later process
    if process.uid != os.getuid():
        raise Untrusted(f"pid {pid} is uid {process.uid}'s process, not yours")
    if not _is_up(process.argv):
        raise Untrusted(f"pid {pid} is not an onelane up: it runs {' '.join(process.argv)[:80]!r}")


def _is_up(argv: tuple[str, ...]) -> bool:
    """Whether a command line runs `onelane up`: the console script, or `python -m cli.main` (tests, `up`'s own
    children)."""
    for at, arg in enumerate(argv):
        if Path(arg).name == "onelane" or (arg == "-m" and argv[at + 1 : at + 2] == ("cli.main",)):
            return "up" in argv[at + 1 :]
    return False
