"""What a streaming client already has of a job's text, across a requeue.

A job whose worker died starts over on the next worker, writing its text again from the start. A stream that has
already sent part of the first run's text goes on where it was: the new run's text is matched against what the
client has and only what comes after is sent (a run is reproducible: greedy, or sampled from the job's own seed).
Should the new run write something else, the stream cannot take back what it sent: it ends with the error
`worker_restarted` and the job is cancelled, since nobody would read it.
"""

from __future__ import annotations

from tasks.job import Job
from web.follow import cancel_quietly
from web.services import services

RESTARTED = (
    "worker_restarted",
    "the worker restarted mid-answer and the answer, generated again, differs from what was streamed; please retry",
)


class Diverged(Exception):
    """The new run wrote other text than the client has."""


class SentText:
    """The text sent to one client, and since a requeue, the new run's text until it has caught up."""

    def __init__(self) -> None:
        self.sent = ""
        self._rerun: str | None = None

    def requeued(self) -> None:
        self._rerun = "" if self.sent else None

    def token(self, text: str) -> str:
        """What of the new `text` to send ('' while a new run catches up); Diverged if the new run differs."""
        if self._rerun is not None:
            self._rerun += text
            if self.sent.startswith(self._rerun):  # still catching up
                return ""
            if not self._rerun.startswith(self.sent):
                raise Diverged
            text, self._rerun = self._rerun[len(self.sent) :], None
        self.sent += text
        return text

    def ended_short(self) -> bool:
        """At the job's end: the new run stopped short of what the client has."""
        return self._rerun is not None and self._rerun != self.sent


def cancel_restarted(job: Job) -> None:
    """Cancel a job whose new run differs from what its client was sent (unless it ended meanwhile)."""
    cancel_quietly(services().store, job, RESTARTED)
