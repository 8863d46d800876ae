"""Follow one job from the web: the one loop behind the SSE feed, OpenAI streams and blocking waits.

A follower yields the job's story: the job's own events (tasks.events.Event) and three states that only the web
knows, named here: `Queued` (its standing while it waits), `Ping` (time to show the connection is alive) and
`Gone` (the client hung up).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

from tasks.errors import OnelaneError
from tasks.events import Event, EventType
from tasks.job import Job, JobStatus
from tasks.store import Standing, Store
from web import sse
from web.connection import client_connected
from web.feed import Feed, Hub, Moved

SOCKET_CHECK_S = 0.1  # how often a waiting request looks whether its client hung up
ETA_MOVED_S, ETA_MOVED_SHARE = 1.0, 0.1  # an ETA that moved by more than both is told at once ...
RETELL_S = 5.0  # ... and any, at least this often


@dataclass(frozen=True)
class Queued:
    """The job waits at `position` (1: next to start), starting in about `eta_s` seconds (tasks/eta.py)."""

    position: int
    eta_s: float | None


@dataclass(frozen=True)
class Ping:
    """Nothing happened for a while: show that the connection is alive."""


@dataclass(frozen=True)
class Gone:
    """The client closed its connection (nothing follows)."""


Story = Event | Queued | Ping | Gone


CLIENT_GONE = ("client_gone", "the client closed its connection")


def cancel_quietly(store: Store, job: Job, error: tuple[str, str]) -> None:
    """Cancel `job` for `error` (CLIENT_GONE: its client hung up), unless it ended meanwhile."""
    with contextlib.suppress(OnelaneError):
        store.cancel(job.id, job.owner, error=error)


def aside(item: Queued | Ping) -> str:
    """What an OpenAI stream sends of the job's standing or of a ping: an SSE comment, which clients skip."""
    if isinstance(item, Queued):
        return sse.comment(f"queued, position {item.position}, eta_s {item.eta_s}")
    return sse.comment("ping")


def with_asides(story: Iterator[Story]) -> Iterator[Event | str]:
    """An OpenAI stream's view of a story: the job's events, and its standing and pings as SSE comments (`aside`)
    between them. It ends where the client left; the stream's own `finally` sees to the job."""
    for item in story:
        if isinstance(item, Gone):
            return
        yield item if isinstance(item, Event) else aside(item)


def follow(
    store: Store,
    hub: Hub,
    job: Job,
    *,
    after: int = -1,
    ping_s: float = 15.0,
    environ: dict[str, Any] | None = None,
    feed: Feed | None = None,
) -> Generator[Story, None, None]:
    """Yield the job's story, ending after exactly one terminal event:

    - Queued while it waits, when its place changes, its ETA moves, and at least every RETELL_S;
    - Ping every `ping_s` seconds (a watched, waiting job's lease is renewed right after);
    - the job's own events from the durable log after index `after`;
    - Gone (and nothing more) if `environ`'s client closed its connection.

    A job that has ended gives what is left of its log after `after` (maybe nothing) and stops at once.

    `feed`, when given, was subscribed before `job` was admitted, and `job` is as admitted: nothing needs
    reading again before the first event.
    """
    admitted = feed is not None
    if not admitted and job.status.ended:
        yield from rest_of_log(store, job, after)
        return
    feed = feed or Feed(store, hub, job.id, after)
    try:
        job = job if admitted else store.get(job.id)  # fresh, now that the feed is subscribed
        if job.status.ended:  # it ended meanwhile
            yield from rest_of_log(store, job, after)
            return
        yield from _Follower(store, feed, job, admitted, ping_s, environ).run()
    finally:
        feed.close()


def rest_of_log(store: Store, job: Job, after: int) -> list[Event]:
    """An ended job's events after index `after`, at once: nothing more will come."""
    # its log is complete: the terminal event is written in the same script that ends the job
    return store.events(job.id, after + 1)


class _Follower:
    """What following one live job keeps between two items of its feed."""

    def __init__(
        self, store: Store, feed: Feed, job: Job, admitted: bool, ping_s: float, environ: dict[str, Any] | None
    ) -> None:
        self.store, self.feed, self.job, self.environ = store, feed, job, environ
        self.waiting = job.status is JobStatus.QUEUED  # in the queue, where its standing is shown
        self.watched = job.spec.watched
        if self.watched:  # running too: if its worker dies, it waits again, and its lease must be renewed in time
            ping_s = min(ping_s, store.settings.watch_grace_s / 3)
            if self.waiting and not admitted:  # admission started its lease
                store.renew_watch(job.id)
        self.ping_s = ping_s
        self.shown: Standing | None = None  # the standing the client was last told
        self.shown_at = time.monotonic()  # ... and when
        self.moved = True  # look the standing up once no more queue moves are pending
        if admitted and job.position is not None:  # as admitted: no need to ask again
            self.shown, self.moved = Standing(job.position, job.eta_s), False
        self.next_ping = time.monotonic() + ping_s

    def run(self) -> Iterator[Story]:
        if self.shown is not None and self.shown.position is not None:  # (as admitted: see __init__)
            yield Queued(self.shown.position, self.shown.eta_s)
        while True:
            item = self.feed.get(timeout_s=self._timeout())
            if item is None:
                yield from self._quiet()
            elif isinstance(item, Moved):
                self.moved = True
            elif isinstance(item, Standing):  # the hub looked it up, for every stream at once
                yield from self._show(item)
            else:
                yield from self._on_event(item)
                if item.terminal:
                    return
            if self.environ is not None and not client_connected(self.environ):
                yield Gone()
                return
            yield from self._ping_when_due()

    def _timeout(self) -> float:
        """How long the feed may wait: not at all while a look-up is pending; with a client's socket to check, a
        moment; otherwise until the next ping."""
        if self.moved:
            return 0
        wait = self.next_ping - time.monotonic()
        return min(wait, SOCKET_CHECK_S) if self.environ is not None else wait

    def _quiet(self) -> Iterator[Queued]:
        """Nothing more is pending: if the queue moved meanwhile, look the standing up, once."""
        if self.moved and self.waiting:
            yield from self._show(self.store.standing(self.job))
        self.moved = False

    def _show(self, standing: Standing) -> Iterator[Queued]:
        if self.waiting and standing.position is not None and self._news(standing):
            self.shown, self.shown_at = standing, time.monotonic()
            yield Queued(standing.position, standing.eta_s)

    def _news(self, standing: Standing) -> bool:
        """Whether the client should be told: its place changed, its ETA moved by more than a little from what it
        was told (counted down since), or it was told nothing for RETELL_S."""
        shown = self.shown
        if shown is None or shown.position != standing.position or shown.eta_s is None or standing.eta_s is None:
            return shown != standing
        since = time.monotonic() - self.shown_at
        drift = abs(standing.eta_s - max(shown.eta_s - since, 0.0))
        return drift > max(ETA_MOVED_S, ETA_MOVED_SHARE * standing.eta_s) or since >= RETELL_S

    def _on_event(self, event: Event) -> Iterator[Event]:
        self.waiting = event.type is EventType.REQUEUED  # its worker died: it waits again, at the front
        self.moved = self.moved or self.waiting
        yield event

    def _ping_when_due(self) -> Iterator[Ping]:
        if time.monotonic() >= self.next_ping:
            yield Ping()
            if self.waiting and self.watched:
                self.store.renew_watch(self.job.id)
            self.next_ping = time.monotonic() + self.ping_s
