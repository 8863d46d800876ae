"""Grammars built and checked away from the web's own process: in checker processes (tasks/grammar_child.py),
answered over a socket, with a time bound and a cache by digest.

Two things make this worth a process. llguidance is native code, and a grammar that crashes it must cost one
request its 400, not every stream of the web process its end. And a big grammar costs CPU: here the web only waits
on a socket, which under gevent lets every other request and stream of the process go on meanwhile.

A check that runs past CHECK_S is a 400 (its checker is killed and started again); a request that finds every
checker busy for WAIT_S is a 503 with Retry-After. Verdicts are kept by digest (CACHED of them), so a batch of
10,000 lines with one schema, or an agent resending its tools every turn, checks it once.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from tasks.errors import CheckerBusy, InvalidRequest

logger = logging.getLogger(__name__)

CHECK_S = 5.0  # one check, at most (the schema bounds keep a real one to milliseconds: tasks/schema_limits.py)
WAIT_S = 10.0  # waiting for a free checker, at most
START_S = 30.0  # a checker's start (Python and llguidance's import), at most, on a loaded machine
CHECKERS = 2  # processes per web process, each checking one grammar at a time
CACHED = 256  # verdicts kept

Kind = Literal["schema", "lark"]


@dataclass(frozen=True)
class Verdict:
    """A grammar llguidance compiles and can read (`grammar`), or why not (`error`)."""

    grammar: str | None
    error: str | None
    kept: bool = True  # False: a verdict of the moment (a timeout), not of the grammar


class _Checker:
    """One checker process and the socket to it."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tasks.grammar_child", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # (a Ctrl-C in the terminal stops the web, which closes the socket: it ends then)
        )
        theirs.close()
        self.sock = ours
        self.channel = ours.makefile("rwb")
        self.started = False

    def ask(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """The checker's answer; None if it died meanwhile; TimeoutError past CHECK_S (past START_S the first time)."""
        self.sock.settimeout(CHECK_S if self.started else START_S + CHECK_S)
        try:
            self.channel.write(json.dumps(request).encode() + b"\n")
            self.channel.flush()
            line = self.channel.readline()
        except (BrokenPipeError, ConnectionResetError):
            return None
        self.started = True
        return json.loads(line) if line else None

    def stop(self) -> None:
        self.process.kill()
        self.sock.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # (a kill is not refused; the process table is busy)
            logger.warning("grammar checker %d did not end within 5 s of its kill", self.process.pid)


class GrammarChecks:
    """The checker processes of this process (started when first needed, again after a fork) and their verdicts."""

    def __init__(self, checkers: int = CHECKERS) -> None:
        self._size = checkers
        self._lock = threading.Lock()
        self._reset()
        atexit.register(self.close)

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._idle: list[_Checker] = []
        self._slots = threading.BoundedSemaphore(self._size)
        self._verdicts: OrderedDict[str, Verdict] = OrderedDict()
        self.asked = 0  # checks that went to a checker (not answered from the kept verdicts)

    def verdict(self, kind: Kind, text: str, overrides: dict[str, Any] | None = None) -> Verdict:
        """What llguidance makes of `text` (a schema's JSON, or a Lark grammar); CheckerBusy if no checker is free."""
        if self._pid != os.getpid():  # a forked child: the checkers are the parent's
            self._reset()
        digest = hashlib.sha256(json.dumps([kind, overrides, text]).encode()).hexdigest()
        with self._lock:
            if (kept := self._verdicts.get(digest)) is not None:
                self._verdicts.move_to_end(digest)
                return kept
        verdict = self._ask({"kind": kind, "text": text, "overrides": overrides})
        if verdict.kept:
            with self._lock:
                self._verdicts[digest] = verdict
                while len(self._verdicts) > CACHED:
                    self._verdicts.popitem(last=False)
        return verdict

    def _ask(self, request: dict[str, Any]) -> Verdict:
        self.asked += 1
        if not self._slots.acquire(timeout=WAIT_S):
            raise CheckerBusy("the server is busy checking other requests' grammars", retry_after_s=int(WAIT_S))
        try:
            with self._lock:
                checker = self._idle.pop() if self._idle else None
            checker = checker or _Checker()
            began = time.monotonic()
            try:
                answer = checker.ask(request)
            except TimeoutError:
                checker.stop()
                logger.warning("a grammar took over %.0f s to check; its checker was started again", CHECK_S)
                return Verdict(None, f"it takes more than {CHECK_S:g} s to check", kept=False)
            if answer is None:
                checker.stop()
                logger.warning(
                    "a grammar crashed its checker (exit %s) after %.2f s",
                    checker.process.returncode,
                    time.monotonic() - began,
                )
                return Verdict(None, "it crashed the grammar compiler")
            with self._lock:
                self._idle.append(checker)
            return Verdict(answer["grammar"], answer["error"])
        finally:
            self._slots.release()

    def warm(self) -> None:
        """Start a checker now, in the background, so that the first request with a schema does not wait for it."""
        if self._pid != os.getpid():
            self._reset()
        threading.Thread(target=self.verdict, args=("lark", 'start: "ok"'), name="grammar-warm", daemon=True).start()

    def close(self) -> None:
        """Stop the idle checkers (at exit; a busy one ends when its socket closes)."""
        if self._pid != os.getpid():
            return
        with self._lock:
            idle, self._idle = self._idle, []
        for checker in idle:
            checker.stop()


CHECKS = GrammarChecks()


def checked(kind: Kind, text: str, param: str, overrides: dict[str, Any] | None = None) -> str:
    """The grammar of `text`, checked; else a 400 naming `param` and llguidance's reason."""
    verdict = CHECKS.verdict(kind, text, overrides)
    if verdict.grammar is None:
        raise InvalidRequest(f"the schema is not supported: {verdict.error}", param=param)
    return verdict.grammar
