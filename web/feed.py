"""Live job events for the web: one pub/sub connection per web process, shared by every open stream.

A connection per stream would cost each stream a Redis connection (and its handshake before the first
event), and every "queue moved" message would cross the socket once per waiting stream, each stream then
asking Redis for its own position. The hub subscribes once, while the process has streams open, to every job's
channel (a pattern) and to the queue's moves: one GPU produces few events, so each web process takes them all and
hands each to the feeds of its job; opening or closing a stream costs Redis nothing. When the queue moves, and
every REFRESH_S meanwhile (an ETA moves with the batch, not only with the queue), the hub looks up the standings
of all the process's waiting feeds in one call. Once no stream has followed a job for IDLE_S, its reader lets go
of the connection and ends (a web process nobody follows holds no subscription and no thread, and does not keep
trying to reach a Redis that went away); the next stream subscribes again.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tasks import keys
from tasks.events import Event
from tasks.store import Standing, Store

logger = logging.getLogger(__name__)

RECONNECT_WAIT_S = 0.5
IDLE_S = 30.0  # how long the hub stays subscribed with no stream open (a user's next request finds it ready)
REFRESH_S = 2.0  # how often waiting jobs' standings are looked up again, the queue moving or not
JOB_CHANNELS = keys.CHANNEL_PREFIX + "*"


@dataclass(frozen=True)
class Lost:
    """Put in every inbox once subscribed again after an outage: messages were missed."""


@dataclass(frozen=True)
class Moved:
    """The queue moved, and the feed cannot tell where its job stands: its follower looks it up."""


LOST, MOVED = Lost(), Moved()
Inbox = queue.Queue[Event | Standing | Lost]  # what the hub hands a feed


class Hub:
    """The process's one pub/sub connection; a reader thread (a greenlet under gevent) routes messages."""

    def __init__(self, store: Store, url: str) -> None:
        self._store = store
        # Its own client: no health-check PINGs written by the reader, and no silent reconnect-and-retry (it
        # would hide that messages were missed meanwhile).
        client = redis.Redis.from_url(url, decode_responses=True, retry=Retry(NoBackoff(), 0))
        self._pubsub = client.pubsub()
        self._lock = threading.Lock()
        self._inboxes: dict[str, set[Inbox]] = {}  # job id -> the inboxes of its feeds
        self._ready = threading.Event()  # Redis confirmed the subscriptions (again, after an outage)
        self._reader: threading.Thread | None = None
        self._looked_at = 0.0  # when the standings were last looked up
        self._unfollowed: float | None = None  # since when no feed has followed a job (None: one does)

    def join(self, job_id: str, inbox: Inbox) -> threading.Event:
        """Deliver `job_id`'s events into `inbox`, and its Standing whenever the queue moves (position None once
        it no longer waits). The event returned is set once the hub's
        subscription is confirmed: from then on, nothing published is missed."""
        with self._lock:
            if self._reader is None:
                self._pubsub.psubscribe(JOB_CHANNELS)
                self._pubsub.subscribe(keys.QUEUE_MOVED)
                self._reader = threading.Thread(target=self._read, name="pubsub-hub", daemon=True)
                self._reader.start()
            self._inboxes.setdefault(job_id, set()).add(inbox)
            self._unfollowed = None
        return self._ready

    def leave(self, job_id: str, inbox: Inbox) -> None:
        with self._lock:
            inboxes = self._inboxes.get(job_id, set())
            inboxes.discard(inbox)
            if not inboxes:
                self._inboxes.pop(job_id, None)
            if not self._inboxes:
                self._unfollowed = time.monotonic()

    def _read(self) -> None:
        down = moved = outage = False
        while not self._retired():
            if down:
                time.sleep(RECONNECT_WAIT_S)
                down = not self._reconnect()
                continue
            try:
                # after a queue move, take whatever else already arrived before looking positions up, once
                message = self._pubsub.get_message(timeout=0.0 if moved else 1.0)
            except (redis.RedisError, OSError) as exc:
                logger.warning("pub/sub connection lost (%s); reconnecting", exc)
                self._ready.clear()
                down = outage = True
                continue
            # ETAs move with time too: every REFRESH_S, however busy the channels are
            if (message is None and moved) or time.monotonic() - self._looked_at >= REFRESH_S:
                moved = False
                self._tell_standings()
            if message is None:
                continue
            if message["type"] == "pmessage":
                with self._lock:
                    inboxes = list(self._inboxes.get(message["channel"].removeprefix(keys.CHANNEL_PREFIX), ()))
                if inboxes:
                    try:
                        event = Event.from_message(message["data"])  # once, for all of the job's feeds
                    except (ValueError, KeyError, TypeError):  # its feeds find the gap and read their logs
                        logger.exception("an event on %s could not be read", message["channel"])
                        continue
                    for inbox in inboxes:
                        inbox.put(event)
            elif message["type"] == "message":  # the queue moved
                moved = True
            elif message["type"] == "subscribe":  # the later of the two confirmations: both are active now
                self._ready.set()
                if outage:  # what was published meanwhile is only in the logs, and the queue may have moved
                    outage, moved = False, True
                    self._tell_lost()

    def _retired(self) -> bool:
        """Whether the reader ends now: no feed has followed a job for IDLE_S. It lets go of its connection; the next
        feed to join subscribes again and starts another reader."""
        with self._lock:
            if self._inboxes or self._unfollowed is None or time.monotonic() - self._unfollowed < IDLE_S:
                return False
            self._reader, self._unfollowed = None, None
            self._ready.clear()
            with contextlib.suppress(redis.RedisError, OSError):  # (its connection is closed either way)
                self._pubsub.reset()
        return True

    def _tell_lost(self) -> None:
        """After a reconnection, tell every feed to read its log: what was published meanwhile is only there."""
        with self._lock:
            inboxes = {inbox for group in self._inboxes.values() for inbox in group}
        for inbox in inboxes:
            inbox.put(LOST)

    def _tell_standings(self) -> None:
        """Look up the standing of every followed job in one call and tell each of its feeds."""
        self._looked_at = time.monotonic()
        with self._lock:
            followed = {job_id: list(inboxes) for job_id, inboxes in self._inboxes.items()}
        if not followed:
            return
        try:
            standings = self._store.standings(list(followed))
        except redis.RedisError as exc:  # the feeds' own pings go on; the next move tries again
            logger.warning("could not look up positions: %s", exc)
            return
        for inboxes, standing in zip(followed.values(), standings):
            for inbox in inboxes:
                inbox.put(standing)

    def _reconnect(self) -> bool:
        """Subscribe again on a fresh connection; False if Redis is still away."""
        with self._lock:
            try:
                self._pubsub.reset()
                self._pubsub.psubscribe(JOB_CHANNELS)
                self._pubsub.subscribe(keys.QUEUE_MOVED)
            except (redis.RedisError, OSError):
                return False
        logger.info("pub/sub connection back")
        return True


class Feed:
    """A job's events as they happen, each exactly once and in order.

    It subscribes first, then reads the durable log: an event published in between is in both and is
    dropped by its index; a live message that was missed (pub/sub is at-most-once) shows up as a gap in
    the indices, or as the hub's "lost" notice, and is read back from the log. While the job waits, each
    queue move brings its Standing (looked up by the hub for all feeds at once); MOVED means "look your standing
    up yourself" (after an outage).

    `replay=False` is for a job about to be admitted: nothing is in its log yet, and the hub, subscribed
    before the admission was sent, gets all of its events.
    """

    def __init__(self, store: Store, hub: Hub, job_id: str, after: int = -1, replay: bool = True) -> None:
        self.store = store
        self.job_id = job_id
        self.next_index = after + 1
        self._hub = hub
        self._inbox: Inbox = queue.Queue()
        self._closed = False
        self._backlog: list[Event] = []
        ready = hub.join(job_id, self._inbox)
        if replay:
            if not ready.wait(10.0):
                self.close()
                raise redis.ConnectionError("Redis did not confirm the subscription within 10 s")
            self._backlog = store.events(job_id, self.next_index)

    def get(self, timeout_s: float) -> Event | Standing | Moved | None:
        """The next event, the job's standing in a queue that moved, or None if nothing came (possibly before
        `timeout_s` elapsed)."""
        if not self._backlog:
            try:
                message = self._inbox.get(timeout=max(timeout_s, 0.0)) if timeout_s > 0 else self._inbox.get_nowait()
            except queue.Empty:
                return None
            if isinstance(message, Lost):
                self._backlog = self.store.events(self.job_id, self.next_index)
                return MOVED if not self._backlog else self.get(0)
            if isinstance(message, Standing):
                return message if message.position is not None else None
            if message.index < self.next_index:
                return None  # already delivered from the log
            if message.index > self.next_index:
                self._backlog = self.store.events(self.job_id, self.next_index)  # missed some: catch up
            else:
                self._backlog = [message]
        event = self._backlog.pop(0)
        self.next_index = event.index + 1
        return event

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._hub.leave(self.job_id, self._inbox)
