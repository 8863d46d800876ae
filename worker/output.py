"""Send a running job's output to Redis off the generation loop, in batches."""

from __future__ import annotations

import logging
import queue
import threading
import time

from tasks.store import Store

logger = logging.getLogger(__name__)

_CLOSE = None
FLUSH_S = 0.02  # after the first token (sent at once), output goes out at most every 20 ms


class OutputWriter:
    """A thread that appends text to the job in Redis, so the GPU loop never waits on a round trip.

    The first token goes out at once (time to first token); then what is produced within FLUSH_S goes out
    as one batch (one token event), so a fast model does not pay a Redis round trip per token. Each write
    also tells whether the job must stop; `stop` is then set (the worker's cancel listener usually has
    set it already).
    """

    def __init__(self, store: Store, job_id: str, worker_id: str, stop: threading.Event) -> None:
        self.store = store
        self.job_id = job_id
        self.worker_id = worker_id
        self.stop = stop
        self.error: BaseException | None = None
        self._queue: queue.SimpleQueue[tuple[str, int, int] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=f"output-{job_id}", daemon=True)
        self._thread.start()

    def put(self, text: str, n_tokens: int, prompt_tokens: int) -> None:
        self._queue.put((text, n_tokens, prompt_tokens))

    def close(self) -> None:
        """Flush everything put so far, then stop the thread; raise what a write raised, if any."""
        self._queue.put(_CLOSE)
        self._thread.join()
        if self.error is not None:
            raise self.error

    def _loop(self) -> None:
        closing = False
        last_flush = 0.0
        while not closing:
            batch = [self._queue.get()]
            while batch[-1] is not _CLOSE:
                wait = last_flush + FLUSH_S - time.monotonic()
                try:
                    batch.append(self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait())
                except queue.Empty:
                    break
            closing = _CLOSE in batch
            items = [item for item in batch if item is not None]
            if not items or self.error is not None:
                continue
            text = "".join(item[0] for item in items)
            n_tokens = sum(item[1] for item in items)
            if text:  # until some text went out (a token may decode to nothing yet), keep sending at once
                last_flush = time.monotonic()
            try:
                if self.store.append(self.job_id, n_tokens, text, items[-1][2], self.worker_id):
                    self.stop.set()
            except Exception as exc:  # Redis gone: stop generating, the caller reports it
                logger.warning("job %s: writing output failed: %s", self.job_id, exc)
                self.error = exc
                self.stop.set()
