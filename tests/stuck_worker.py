"""A worker whose generation hangs (the mlx-lm#1472 failure): it holds the device and renews its lease, claims
a job, and never produces a token. The supervisor must notice from outside and kill it."""

from __future__ import annotations

import time
import uuid

from tasks.settings import Settings
from tasks.store import Store

if __name__ == "__main__":
    settings = Settings.from_env()
    store = Store.connect(settings)
    worker = uuid.uuid4().hex
    claimed = None
    while True:
        if store.take_device(worker) == "ok" and claimed is None:
            claimed = store.claim_now(worker)
        time.sleep(0.05)
