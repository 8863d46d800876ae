"""The app's services: the settings, the job store, the broker, the pub/sub hub, the housekeeper, the file store,
the batches, and the threads the app starts beside them (the batch runner: web/__init__.py).

Built once per app by `web.create_app`; a view reaches them with `services()` (as flaskr's `get_db`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from dramatiq.brokers.redis import RedisBroker
from flask import current_app

from tasks.background import Background
from tasks.batches import BatchStore
from tasks.broker import make_broker
from tasks.files import FileStore
from tasks.housekeeping import Housekeeper
from tasks.settings import Settings
from tasks.store import Store
from web.feed import Hub

EXTENSION = "onelane"
B = TypeVar("B", bound=Background)


@dataclass(frozen=True)
class Services:
    settings: Settings
    store: Store
    broker: RedisBroker
    hub: Hub  # the process's one pub/sub connection, for every open stream
    housekeeper: Housekeeper  # expires jobs on time even while no worker runs
    files: FileStore  # uploaded files (/v1/files)
    batches: BatchStore  # /v1/batches
    threads: list[Background] = field(default_factory=list)  # the app's own, stopped with the services

    @classmethod
    def start(cls, settings: Settings) -> Services:
        """Connect to Redis and the broker, and start the housekeeper (the hub connects on its first stream)."""
        store = Store.connect(settings)
        broker = make_broker(settings, worker=False)
        files, batches = FileStore(store.redis, settings, store.memory), BatchStore(store.redis, settings, store.memory)
        return cls(
            settings=settings,
            store=store,
            broker=broker,
            hub=Hub(store, settings.effective_redis_url),
            housekeeper=Housekeeper(store, broker).start(),
            files=files,
            batches=batches,
        )

    def keep(self, thread: B) -> B:
        """`thread`, one the app started, to be stopped with the services."""
        self.threads.append(thread)
        return thread

    def stop(self) -> None:
        """Stop the app's threads (tests and benches that build apps in one process)."""
        for thread in (self.housekeeper, *self.threads):
            thread.stop()


def services() -> Services:
    """The current app's services."""
    return current_app.extensions[EXTENSION]  # type: ignore[no-any-return]  # (Flask's extensions hold Any)
