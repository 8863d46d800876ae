"""Grammars built and checked away from the web's own process: in checker processes (tasks/grammar_child.py, run
as tasks/children.py runs its children), with a time bound and a cache by digest.

llguidance is native code: a grammar that crashes it must cost one request its 400, not every stream of the web
process its end; and a big grammar costs CPU, which must not hold the web's gevent loop.

A check that runs past CHECK_S is a 400 (its checker is killed and started again); a request that finds every
checker busy for WAIT_S is a 503 with Retry-After. Verdicts are kept by digest (CACHED of them), so a batch of
10,000 lines with one schema, or an agent resending its tools every turn, checks it once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Literal

from tasks.children import ChildKind, Children, Crashed, Overran
from tasks.errors import CheckerBusy, InvalidRequest

logger = logging.getLogger(__name__)

CHECK_S = 5.0  # one check, at most (the schema bounds keep a real one to milliseconds: tasks/schema_limits.py)
WAIT_S = 10.0  # waiting for a free checker, at most
CHECKERS = 2  # processes per web process, each checking one grammar at a time
CACHED = 256  # verdicts kept
CHECKER = ChildKind(
    module="tasks.grammar_child",
    name="grammar checker",
    size=CHECKERS,
    answer_s=CHECK_S,
    wait_s=WAIT_S,
    busy=CheckerBusy,
)

GrammarKind = Literal["schema", "lark"]


@dataclass(frozen=True)
class Verdict:
    """A grammar llguidance compiles and can read (`grammar`), or why not (`error`)."""

    grammar: str | None
    error: str | None
    kept: bool = True  # False: a verdict of the moment (a timeout), not of the grammar


class GrammarChecks:
    """The checker processes of this process and their verdicts."""

    def __init__(self, checkers: int = CHECKERS) -> None:
        self.children = Children(replace(CHECKER, size=checkers))
        self._lock = threading.Lock()
        self._verdicts: OrderedDict[str, Verdict] = OrderedDict()

    @property
    def asked(self) -> int:
        """Checks that went to a checker (not answered from the kept verdicts)."""
        return self.children.asked

    def verdict(self, kind: GrammarKind, text: str, overrides: dict[str, Any] | None = None) -> Verdict:
        """What llguidance makes of `text` (a schema's JSON, or a Lark grammar); CheckerBusy if no checker is free."""
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
        try:
            answer, _ = self.children.ask(request)
        except Overran:
            return Verdict(None, f"it takes more than {CHECK_S:g} s to check", kept=False)
        except Crashed:
            return Verdict(None, "it crashed the grammar compiler")
        return Verdict(answer["grammar"], answer["error"])

    def warm(self) -> None:
        """Start a checker now, in the background, so that the first request with a schema does not wait for it."""
        self.children.warm({"kind": "lark", "text": 'start: "ok"', "overrides": None})

    def close(self) -> None:
        self.children.close()


CHECKS = GrammarChecks()


def checked(kind: GrammarKind, text: str, param: str, overrides: dict[str, Any] | None = None) -> str:
    """The grammar of `text`, checked; else a 400 naming `param` and llguidance's reason."""
    verdict = CHECKS.verdict(kind, text, overrides)
    if verdict.grammar is None:
        raise InvalidRequest(f"the schema is not supported: {verdict.error}", param=param)
    return verdict.grammar
