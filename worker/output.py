"""Send a running job's output to Redis off the generation loop, in batches."""

from __future__ import annotations

import logging
import queue
import threading
import time

from tasks.store import Store

logger = logging.getLogger(__name__)

_END = None
FLUSH_S = 0.02  # after the first text (sent at once), output goes out at most every 20 ms


class OutputWriter:
    """One thread, for the worker's life, that appends each job's text to Redis so the GPU loop never waits
    on a round trip.

    Until some text went out (a token may decode to no text yet), each token is written at once, from the
    generating thread itself: no hand-off delays the first token (the next one is being computed meanwhile).
    Then what is produced within FLUSH_S goes out as one batch (one token event) from the writer's thread, so
    a fast model does not pay a Redis round trip per token. Each write also tells whether the job must stop;
    the job's `stop` is then set (the worker's cancel listener usually has set it already). Jobs come one at
    a time: begin(), put()..., end().
    """

    def __init__(self, store: Store, worker_id: str) -> None:
        self.store = store
        self.worker_id = worker_id
        self.job_id = ""
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._queue: queue.SimpleQueue[tuple[str, int, int] | None] = queue.SimpleQueue()
        self._ended = threading.Event()
        self._text_sent = False
        self._last_flush = 0.0
        self._thread = threading.Thread(target=self._loop, name="output", daemon=True)
        self._thread.start()

    def begin(self, job_id: str, stop: threading.Event) -> None:
        """Write for `job_id` from now on (the previous job has ended: the thread waits for its first put)."""
        self.job_id, self.stop, self.error = job_id, stop, None
        self._text_sent, self._last_flush = False, 0.0
        self._ended.clear()

    def put(self, text: str, n_tokens: int, prompt_tokens: int) -> None:
        if self._text_sent:
            self._queue.put((text, n_tokens, prompt_tokens))
        elif self.error is None:
            self._write(text, n_tokens, prompt_tokens)
            if text:
                self._text_sent, self._last_flush = True, time.monotonic()

    def end(self) -> None:
        """Flush everything put for this job; raise what a write raised, if any."""
        self._queue.put(_END)
        self._ended.wait()
        if self.error is not None:
            raise self.error

    def _loop(self) -> None:
        while True:
            batch = [self._queue.get()]
            while batch[-1] is not _END:
                wait = self._last_flush + FLUSH_S - time.monotonic()
                try:
                    batch.append(self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait())
                except queue.Empty:
                    break
            items = [item for item in batch if item is not None]
            if items and self.error is None:
                self._last_flush = time.monotonic()
                self._write("".join(item[0] for item in items), sum(item[1] for item in items), items[-1][2])
            if batch[-1] is _END:
                self._ended.set()

    def _write(self, text: str, n_tokens: int, prompt_tokens: int) -> None:
        try:
            if self.store.append(self.job_id, n_tokens, text, prompt_tokens, self.worker_id):
                self.stop.set()
        except Exception as exc:  # Redis gone: stop generating, the caller reports it
            logger.warning("job %s: writing output failed: %s", self.job_id, exc)
            self.error = exc
            self.stop.set()
