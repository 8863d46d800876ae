"""Live job events for the web: one pub/sub connection per web process, shared by every open stream.

A connection per stream would cost each stream a Redis connection (and its handshake before the first
event), and every "queue moved" message would cross the socket once per waiting stream, each stream then
asking Redis for its own position. The hub holds one subscription per channel for the whole process, hands
each message to the feeds that want it, and when the queue moves, looks up the positions of all the
process's feeds in one call.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Iterable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tasks import keys
from tasks.store import Store

logger = logging.getLogger(__name__)

LOST = {"type": "lost"}  # put in a channel's inboxes once it is subscribed again after an outage
RECONNECT_WAIT_S = 0.5


class Hub:
    """The process's one pub/sub connection; a reader thread (a greenlet under gevent) routes messages."""

    def __init__(self, store: Store, url: str) -> None:
        self._store = store
        self._standing: dict[str, set[queue.Queue[Any]]] = {}  # job id -> inboxes told its standing on moves
        self._moves = False  # subscribed to the queue's moves (then for good: no churn as streams come and go)
        # Its own client: no health-check PINGs written by the reader while requests write SUBSCRIBEs, and no
        # silent reconnect-and-retry (it would hide that messages were missed meanwhile).
        client = redis.Redis.from_url(url, decode_responses=True, retry=Retry(NoBackoff(), 0))
        self._pubsub = client.pubsub()
        self._lock = threading.Lock()
        self._inboxes: dict[str, set[queue.Queue[Any]]] = {}
        self._unconfirmed: dict[str, int] = {}  # SUBSCRIBE commands sent per channel, not yet confirmed
        self._waiters: list[tuple[frozenset[str], threading.Event]] = []
        self._resubscribed: set[str] = set()  # channels subscribed again after an outage, not yet confirmed
        self._reader: threading.Thread | None = None

    def subscribe(self, channels: Iterable[str], inbox: queue.Queue[Any]) -> threading.Event:
        """Deliver the messages of `channels` into `inbox`; the event is set once Redis has them subscribed."""
        channels = frozenset(channels)
        active = threading.Event()
        with self._lock:
            new = [channel for channel in channels if not self._inboxes.get(channel)]
            for channel in channels:
                self._inboxes.setdefault(channel, set()).add(inbox)
            if new:
                for channel in new:
                    self._unconfirmed[channel] = self._unconfirmed.get(channel, 0) + 1
                try:
                    self._pubsub.subscribe(*new)
                except BaseException:
                    self._forget(channels, inbox)
                    raise
            self._waiters.append((channels, active))
            self._wake_waiters()
            self._start_reader()
        return active

    def follow_standing(self, job_id: str, inbox: queue.Queue[Any]) -> None:
        """Put {"type": "standing", "position", "eta_s"} in `inbox` whenever the queue moves (position None
        once the job no longer waits). The hub subscribes to the moves once, for the process's life."""
        with self._lock:
            if not self._moves:
                self._pubsub.subscribe(keys.QUEUE_MOVED)
                self._moves = True
            self._standing.setdefault(job_id, set()).add(inbox)
            self._start_reader()

    def unfollow_standing(self, job_id: str, inbox: queue.Queue[Any]) -> None:
        with self._lock:
            inboxes = self._standing.get(job_id, set())
            inboxes.discard(inbox)
            if not inboxes:
                self._standing.pop(job_id, None)

    def _start_reader(self) -> None:
        if self._reader is None:
            self._reader = threading.Thread(target=self._read, name="pubsub-hub", daemon=True)
            self._reader.start()

    def unsubscribe(self, channels: Iterable[str], inbox: queue.Queue[Any]) -> None:
        with self._lock:
            gone = self._forget(frozenset(channels), inbox)
            if gone:
                try:
                    self._pubsub.unsubscribe(*gone)
                except redis.RedisError:  # the connection is down: reconnecting resubscribes only what is left
                    pass

    def _forget(self, channels: frozenset[str], inbox: queue.Queue[Any]) -> list[str]:
        gone = []
        for channel in channels:
            inboxes = self._inboxes.get(channel, set())
            inboxes.discard(inbox)
            if not inboxes:
                self._inboxes.pop(channel, None)
                gone.append(channel)
        return gone

    def _wake_waiters(self) -> None:
        """Set the event of every subscriber whose channels Redis has all confirmed (lock held)."""
        left = []
        for channels, event in self._waiters:
            if any(self._unconfirmed.get(channel, 0) > 0 for channel in channels):
                left.append((channels, event))
            else:
                event.set()
        self._waiters = left

    def _read(self) -> None:
        down = moved = False
        while True:
            if down:
                time.sleep(RECONNECT_WAIT_S)
                down = not self._reconnect()
                continue
            try:
                # after a queue move, take whatever else already arrived before looking positions up, once
                message = self._pubsub.get_message(timeout=0.0 if moved else 1.0)
            except (redis.RedisError, OSError) as exc:
                logger.warning("pub/sub connection lost (%s); reconnecting", exc)
                down = True
                continue
            if message is None:
                if moved:
                    moved = False
                    self._tell_standings()
                continue
            if message["type"] == "message" and message["channel"] == keys.QUEUE_MOVED:
                moved = True
            elif message["type"] == "subscribe":
                with self._lock:
                    channel = message["channel"]
                    self._unconfirmed[channel] = max(0, self._unconfirmed.get(channel, 0) - 1)
                    self._wake_waiters()
                    # subscribed again after an outage: what was published meanwhile is only in the logs now
                    again = channel in self._resubscribed
                    lost = self._inboxes.get(channel, set()) if again else set()
                    self._resubscribed.discard(channel)
                moved = moved or (again and channel == keys.QUEUE_MOVED)  # moves may have been missed too
                for inbox in lost:
                    inbox.put(LOST)
            elif message["type"] == "message":
                with self._lock:
                    inboxes = list(self._inboxes.get(message["channel"], ()))
                for inbox in inboxes:
                    inbox.put(message)

    def _tell_standings(self) -> None:
        """Look up the standing of every followed job in one call and tell each of its feeds."""
        with self._lock:
            followed = {job_id: list(inboxes) for job_id, inboxes in self._standing.items()}
        if not followed:
            return
        try:
            standings = self._store.standings(list(followed))
        except redis.RedisError as exc:  # the feeds' own pings go on; the next move tries again
            logger.warning("could not look up positions: %s", exc)
            return
        for (job_id, inboxes), standing in zip(followed.items(), standings):
            item = {"type": "standing", "position": standing.position, "eta_s": standing.eta_s}
            for inbox in inboxes:
                inbox.put(item)

    def _reconnect(self) -> bool:
        """Subscribe again, on a fresh connection, to every channel still wanted; False if Redis is still away."""
        with self._lock:
            wanted = list(self._inboxes) + ([keys.QUEUE_MOVED] if self._moves else [])
            try:
                self._pubsub.reset()
                if wanted:
                    self._pubsub.subscribe(*wanted)
            except (redis.RedisError, OSError):
                return False
            for channel in wanted:
                self._unconfirmed[channel] = self._unconfirmed.get(channel, 0) + 1
            self._resubscribed.update(wanted)
            logger.info("pub/sub connection back (%d channels)", len(wanted))
            return True



class Feed:
    """A job's events as they happen, each exactly once and in order.

    It subscribes first, then reads the durable log: an event published in between is in both and is
    dropped by its index; a live message that was missed (pub/sub is at-most-once) shows up as a gap in
    the indices, or as the hub's "lost" notice, and is read back from the log. While the job waits, each
    queue move brings {"type": "standing", "position", "eta_s"} (looked up by the hub for all feeds at once);
    {"type": "moved"} means "look your standing up yourself" (after an outage).

    `replay=False` is for a job about to be admitted: nothing is in its log yet, and no event of it can be
    published before Redis reads this subscription (sent before the admission, which must come first).
    """

    def __init__(self, store: Store, hub: Hub, job_id: str, after: int = -1, replay: bool = True) -> None:
        self.store = store
        self.job_id = job_id
        self.next_index = after + 1
        self._hub = hub
        self._channels = (keys.channel(job_id),)
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._closed = False
        self._backlog: list[dict[str, Any]] = []
        try:
            hub.follow_standing(job_id, self._inbox)
            active = hub.subscribe(self._channels, self._inbox)
            if replay:
                if not active.wait(10.0):
                    raise redis.ConnectionError("Redis did not confirm the subscription within 10 s")
                self._backlog = store.events(job_id, self.next_index)
        except BaseException:
            self.close()
            raise

    def get(self, timeout_s: float) -> dict[str, Any] | None:
        """The next event, or None if none came (possibly before `timeout_s` elapsed)."""
        if not self._backlog:
            try:
                message = self._inbox.get(timeout=max(timeout_s, 0.0)) if timeout_s > 0 else self._inbox.get_nowait()
            except queue.Empty:
                return None
            if message is LOST:
                self._backlog = self.store.events(self.job_id, self.next_index)
                return {"type": "moved"} if not self._backlog else self.get(0)
            if message["type"] == "standing":
                return message if message["position"] is not None else None
            live = json.loads(message["data"])
            if live["i"] < self.next_index:
                return None  # already delivered from the log
            if live["i"] > self.next_index:
                self._backlog = self.store.events(self.job_id, self.next_index)  # missed some: catch up
            else:
                self._backlog = [{"i": live["i"], **live["e"]}]
        event = self._backlog.pop(0)
        self.next_index = event["i"] + 1
        return event

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._hub.unsubscribe(self._channels, self._inbox)
            self._hub.unfollow_standing(self.job_id, self._inbox)
