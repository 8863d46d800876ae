"""A worker whose generation hangs (the mlx-lm#1472 failure): it holds the device and renews its lease, claims
a job, and never produces a token. The supervisor must notice from outside and kill it."""

from __future__ import annotations

import time
import uuid

from tasks.settings import Settings
from tasks.store import Store
from tests.helpers import claim_now

if __name__ == "__main__":
    settings = Settings.from_env()
    store = Store.connect(settings)
    worker = uuid.uuid4().hex
    claimed = None
    while True:
        if store.for_worker(worker).take_device() == "ok" and claimed is None:
            claimed = claim_now(store, worker)
        time.sleep(0.05)
