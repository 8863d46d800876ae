"""Where the terminal client finds the web: ONELANE_URL when it is set; else the web that `onelane up` runs from this
folder, which `up` records in its var folder (ONELANE_VAR_DIR, default ./var) as web.json for as long as it runs;
else http://127.0.0.1:8000.

A record outlives an `up` killed outright. It names up's pid, and a record whose pid is gone is refused at once,
saying so and what to do, before any request: never a wait on a port that nobody (or somebody else) serves now, and
never a silent fall back to 127.0.0.1:8000, which may be another onelane than the one this folder ran.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tasks.settings import ENV_NAMES, Settings

DEFAULT_URL = "http://127.0.0.1:8000"
RECORD = "web.json"


class StaleRecord(Exception):
    """The record of `onelane up` in the var folder is of one that has ended (or is unreadable)."""


@dataclass(frozen=True)
class Found:
    """The web's base URL, and how it was found (said in the client's errors)."""

    url: str
    how: str


def find(environ: Mapping[str, str] = os.environ) -> Found:
    """ONELANE_URL, else the `onelane up` of ONELANE_VAR_DIR, else the default; StaleRecord if that up has ended."""
    if environ.get("ONELANE_URL"):
        return Found(environ["ONELANE_URL"], "ONELANE_URL")
    path = Path(environ.get(ENV_NAMES["var_dir"]) or Settings.model_fields["var_dir"].default) / RECORD
    try:
        recorded = json.loads(path.read_text())
        url, pid = str(recorded["url"]), int(recorded["pid"])
    except FileNotFoundError:
        return Found(DEFAULT_URL, "the default: start onelane with `onelane up`, or set ONELANE_URL to where it runs")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StaleRecord(f"{path} is unreadable ({exc}): remove it, or set ONELANE_URL to the server's URL") from None
    if not _alive(pid):
        raise StaleRecord(
            f"the onelane up that served {url} from here (pid {pid}, recorded in {path}) has ended: start it again "
            f"with `onelane up`, or set ONELANE_URL to the server you mean (then {path} is not read)"
        )
    return Found(url, f"onelane up's, pid {pid}, from {path}; ONELANE_URL overrides it")


def record(path: Path, host: str, port: int) -> None:
    """Record this process's web at host:port for the client; written whole or not at all (a rename)."""
    if host in ("0.0.0.0", "::", ""):  # listening everywhere: this machine reaches it on loopback
        host = "127.0.0.1" if host != "::" else "::1"
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps({"url": url, "pid": os.getpid()}) + "\n")
    partial.replace(path)


def forget(path: Path) -> None:
    """Remove the record if it is still this process's (another `up` may have recorded its own since)."""
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def _alive(pid: int) -> bool:
    if pid <= 0:  # (kill(0) would signal our own group)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
