"""The dramatiq side of the contract: one broker, one GPU queue, one actor name.

A message carries only a job id. It means "a job was admitted: run what waits". The worker then claims jobs
from Redis in fair order (start-time fair queuing across users) until none waits, so the next job starts
the moment one ends, without a message round trip in between. Every admitted job still sends its message:
duplicate or late deliveries are harmless, a claim that finds nothing waiting does nothing.

dramatiq's Redis consumer polls with a backoff of up to its timeout, which adds up to that much to every
pickup. Here the consumer instead blocks on dramatiq's own queue list (BLMOVE of the list onto itself: it
returns as soon as a message id is pushed, and leaves the id in place for dramatiq's fetch script to take).
An idle worker costs Redis one blocking command per idle timeout, and a busy one none (its consumer waits
in-process for the ack).

The web does not send through the broker: it hands admit.lua the job's message (a `Doorbell`), which the
script pushes exactly as dramatiq's enqueue does, in the same step as the job. So no admitted job lacks its
message (even if the web dies right after), and admission is one round trip instead of two.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import dramatiq
import redis
from dramatiq.brokers.redis import MAINTENANCE_SCALE, RedisBroker, _RedisConsumer
from dramatiq.common import current_millis
from dramatiq.errors import ConnectionClosed
from dramatiq.middleware import Retries

from tasks import keys
from tasks.connection import timeouts
from tasks.settings import Settings

QUEUE_NAME = "onelane-gpu"
ACTOR_NAME = "run_next"
NAMESPACE = "onelane-dramatiq"
MAX_BLOCK_S = 10  # the longest a consumer's blocking read waits for a message (the worker's idle timeout is less)
MAX_UNPACK = 1000  # ids a maintenance round unpacks at once (dramatiq's default allows far more; we move few)


class BlockingRedisBroker(RedisBroker):
    """dramatiq's Redis broker, whose consumers block until a message arrives instead of polling."""

    @property
    def consumer_class(self) -> type[_RedisConsumer]:
        return _BlockingConsumer


class _BlockingConsumer(_RedisConsumer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue_key = keys.dramatiq_queue(self.broker.namespace, self.queue_name)
        self.acked = threading.Event()  # set by every ack: a busy consumer can take the next message

    def __next__(self) -> Any:
        if self.message_cache:
            return self._hand_out()
        try:
            if self.outstanding_message_count >= self.prefetch:  # busy: wait for an ack, not on Redis
                self.acked.wait(self.timeout / 1000)
                return None
            self.message_cache = self._wait_and_fetch(self.prefetch - self.outstanding_message_count)
            return self._hand_out() if self.message_cache else None
        except redis.ConnectionError as exc:
            raise ConnectionClosed(exc) from None

    def _wait_and_fetch(self, wanted: int) -> list[Any]:
        """Wait until a message id is in the queue (at once if one is), then fetch, in one round trip.

        BLMOVE of the list onto itself returns as soon as the list holds an id and leaves it in place (ids
        are doorbells here: their order does not matter); dramatiq's fetch script, sent behind it on the
        same connection, runs the moment the wait ends, with the arguments RedisBroker.do_fetch gives it
        (its dispatch.lua documents them), maintenance at the broker's odds included.
        """
        b = self.broker
        fetch = b.scripts["dispatch"]
        maintenance = int(random.randint(1, MAINTENANCE_SCALE) <= b.maintenance_chance)
        args = [
            "fetch",
            current_millis(),
            self.queue_name,
            b.broker_id,
            b.heartbeat_timeout,
            b.dead_message_ttl,
            maintenance,
            MAX_UNPACK,
            wanted,
        ]
        with b.client.pipeline(transaction=False) as pipe:
            pipe.blmove(self.queue_key, self.queue_key, self.timeout / 1000, "RIGHT", "LEFT")
            pipe.evalsha(fetch.sha, 1, b.namespace, *args)
            try:
                return pipe.execute()[1] or []
            except redis.exceptions.NoScriptError:  # Redis restarted and lost its scripts: load, look again
                b.client.script_load(fetch.script)
                return []

    def _hand_out(self) -> Any:
        self.acked.clear()
        return super().__next__()

    def ack(self, message: Any) -> None:
        try:
            super().ack(message)
        finally:
            self.acked.set()

    def nack(self, message: Any) -> None:
        try:
            super().nack(message)
        finally:
            self.acked.set()


def make_broker(settings: Settings, worker: bool = True) -> RedisBroker:
    """The broker; for the worker with no retries (a retry could generate twice) and no age limit.

    The per-job time limit is the runner's (checked at every token; a message may run several jobs), and a
    worker stuck inside one token is the supervisor's to kill. The web only sends messages: no middleware.
    """
    middleware = [Retries(max_retries=0)] if worker else []
    # its consumer blocks on Redis for up to the worker's idle timeout: that wait is not a silent connection
    url = settings.effective_redis_url
    client = redis.Redis.from_url(url, **timeouts(url, settings.redis_timeout_s, blocking_s=MAX_BLOCK_S))
    broker = BlockingRedisBroker(client=client, namespace=NAMESPACE, middleware=middleware)
    broker.declare_queue(QUEUE_NAME)
    return broker


def run_next_message(job_id: str) -> dramatiq.Message[Any]:
    return dramatiq.Message(queue_name=QUEUE_NAME, actor_name=ACTOR_NAME, args=(job_id,), kwargs={}, options={})


@dataclass(frozen=True)
class Doorbell:
    """A job's `run_next` message, ready for a Lua script to push as RedisBroker.enqueue would."""

    queue_key: str
    messages_key: str
    message_id: str
    payload: bytes

    @classmethod
    def ring(cls, broker: RedisBroker, job_id: str) -> Doorbell:
        message_id = str(uuid4())  # what RedisBroker.enqueue gives every message it enqueues
        message = run_next_message(job_id).copy(options={"redis_message_id": message_id})
        return cls(
            keys.dramatiq_queue(broker.namespace, QUEUE_NAME),
            keys.dramatiq_messages(broker.namespace, QUEUE_NAME),
            message_id,
            message.encode(),
        )
