"""Send the running jobs' output, endings and hand-backs to Redis off the generation loop, in order per job.

One thread, for the worker's life. What the loop hands it within FLUSH_S goes out as one pipeline (one round
trip): per job, the text of that window as one token event, then the job's ending if it came. A job's first
text and every ending go out at once (a client waits on them); the rest waits for the window, so a fast batch
does not pay a round trip per token. Each output write also tells whether its job must stop (cancelled, or no
longer this worker's): the loop is told through `on_stop`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from tasks.job import JobStatus
from tasks.store import Store

logger = logging.getLogger(__name__)

FLUSH_S = 0.02
HAND_BACK_PATIENCE_S = 30.0


@dataclass(frozen=True)
class Ending:
    """How a job ended, recorded after its last output."""

    job_id: str
    status: JobStatus
    finish_reason: str | None = None
    error: tuple[str, str] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    stop_seen_at: int | None = None


@dataclass(frozen=True)
class Text:
    """A job's new text: from one step, as the loop hands it over, or from a window's steps, as the writer sends it."""

    job_id: str
    text: str
    prompt_tokens: int
    n_tokens: int = 1

    def __add__(self, later: Text) -> Text:
        """This text, then `later`'s (the writer sends a window's texts of one job as one)."""
        return Text(self.job_id, self.text + later.text, later.prompt_tokens, self.n_tokens + later.n_tokens)


@dataclass(frozen=True)
class _HandBack:
    job_id: str
    why: str
    shared: bool


Item = Text | Ending | _HandBack


class OutputWriter:
    """The writer thread; `begin`, `put_many`, `end` and `hand_back` are called by the loop and never block it.

    The loop wakes the thread only for what must go out at once (a job's first text, an ending, a hand-back) and
    for the first item of a window; the rest waits for the window to close, so a fast batch does not pay a
    thread hand-off per step either.
    """

    def __init__(
        self, store: Store, worker_id: str, on_stop: Callable[[str], None], on_fatal: Callable[[str], None]
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.on_stop = on_stop
        self.on_fatal = on_fatal
        self._fresh: set[str] = set()  # jobs none of whose text was handed over yet (the loop's thread only)
        self._handed = threading.Condition()  # guards what follows
        self._pending: list[Item] = []  # handed over, not taken by the writer yet
        self._urgent = False  # something pending must go out now
        self._writing = False  # the writer is sending what it took
        self._endings_in = self._endings_out = 0  # endings and hand-backs handed over, and written
        self._last_flush = 0.0
        self._thread = threading.Thread(target=self._loop, name="output", daemon=True)
        self._thread.start()

    def begin(self, job_id: str) -> None:
        self._fresh.add(job_id)

    def put_many(self, texts: list[Text]) -> None:
        """One step's output: a Text for each job that got a token."""
        if not texts:
            return
        urgent = False
        for t in texts:
            if t.text and t.job_id in self._fresh:  # its client waits for the first text
                self._fresh.discard(t.job_id)
                urgent = True
        self._put(texts, urgent)

    def end(self, ending: Ending) -> None:
        self._fresh.discard(ending.job_id)
        self._put([ending], True)

    def hand_back(self, job_id: str, why: str, shared: bool = False) -> None:
        """Put a running job back at the front of the queue, after its output so far (see Store.hand_back)."""
        self._fresh.discard(job_id)
        self._put([_HandBack(job_id, why, shared)], True)

    def settle(self, timeout_s: float = 30.0) -> bool:
        """Until every ending and hand-back handed over is recorded: a slot goes to the next job only once the job
        that held it has its end in Redis."""
        with self._handed:
            return self._handed.wait_for(lambda: self._endings_out >= self._endings_in, timeout_s)

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Until everything handed over is written (for an orderly stop)."""
        with self._handed:
            return self._handed.wait_for(lambda: not self._pending and not self._writing, timeout_s)

    def _put(self, items: Sequence[Item], urgent: bool) -> None:
        with self._handed:
            wake = urgent or not self._pending  # the first item opens a window: the writer must time it
            self._pending += items
            self._urgent = self._urgent or urgent
            self._endings_in += sum(1 for item in items if not isinstance(item, Text))
            if wake:
                self._handed.notify_all()

    def _take(self) -> list[Item]:
        """Wait for something to write; then, unless it is urgent, for the window to close."""
        with self._handed:
            self._writing = False
            self._handed.notify_all()  # for wait_idle
            self._handed.wait_for(lambda: self._pending)
            while not self._urgent and (left := self._last_flush + FLUSH_S - time.monotonic()) > 0:
                self._handed.wait(left)
            items, self._pending, self._urgent, self._writing = self._pending, [], False, True
            return items

    def _loop(self) -> None:
        while True:
            items = self._take()
            try:
                self._write(items)
            except Exception:  # never let the thread die: the loop would wait on it forever
                logger.exception("output writer: unexpected error")

    def _write(self, items: list[Item]) -> None:
        """Everything in `items` as one pipeline: per job its text so far as one write, before its ending."""
        self._last_flush = time.monotonic()
        texts: dict[str, Text] = {}  # job id -> its text so far, in order of arrival
        ops: list[Item] = []
        for item in items:
            if isinstance(item, Text):
                texts[item.job_id] = texts[item.job_id] + item if item.job_id in texts else item
            else:
                if item.job_id in texts:
                    ops.append(texts.pop(item.job_id))
                ops.append(item)
        ops += texts.values()
        if not ops:
            return
        results = self._send(ops)
        lost = [n for n, result in enumerate(results) if isinstance(result, redis.exceptions.NoScriptError)]
        if lost:  # Redis forgot the scripts (a restart): those did not run; load them and send those again
            try:
                self.store.load_scripts()
            except redis.RedisError:
                pass
            for n, result in zip(lost, self._send([ops[n] for n in lost])):
                results[n] = result
        for op, result in zip(ops, results):
            self._settle(op, result)
            if not isinstance(op, Text):
                with self._handed:
                    self._endings_out += 1
                    self._handed.notify_all()

    def _send(self, ops: list[Item]) -> list[Any]:
        """The ops as one pipeline (one round trip); each op's reply, or the error it met."""
        pipe = self.store.redis.pipeline(transaction=False)
        for op in ops:
            self._queue_op(op, pipe)
        try:
            return list(pipe.execute(raise_on_error=False))
        except redis.RedisError as exc:
            logger.warning("writing output failed: %s", exc)
            return [exc] * len(ops)

    def _queue_op(self, op: Item, pipe: Any) -> None:
        if isinstance(op, Text):
            self.store.append(op.job_id, op.n_tokens, op.text, op.prompt_tokens, self.worker_id, pipe=pipe)
        elif isinstance(op, Ending):
            self.store.finish(
                op.job_id, op.status, self.worker_id, finish_reason=op.finish_reason, error=op.error,
                prompt_tokens=op.prompt_tokens, completion_tokens=op.completion_tokens, stop_seen_at=op.stop_seen_at,
                pipe=pipe,
            )  # fmt: skip
        elif isinstance(op, _HandBack):
            self.store.hand_back(op.job_id, self.worker_id, op.why, op.shared, pipe=pipe)

    def _settle(self, op: Item, result: Any) -> None:
        failed = isinstance(result, Exception)
        if isinstance(op, Text):
            if failed or result:  # Redis away, or the job must stop: either way it stops
                self.on_stop(op.job_id)
        elif failed:  # an ending or a hand-back that did not reach Redis: hand the job back, patiently
            logger.warning("job %s: could not record its outcome (%s); handing it back", op.job_id, result)
            self._hand_back_patiently(op.job_id)
        elif isinstance(op, Ending) and not result:
            logger.warning("job %s: taken away from this worker (presumed dead); its outcome was dropped", op.job_id)
        elif isinstance(op, _HandBack):
            logger.info("job %s: handed back: %s", op.job_id, result[1] if result else "not running here")

    def _hand_back_patiently(self, job_id: str) -> None:
        """Retry until Redis answers; if it never does, this worker exits: its lease lapses, and the next worker
        recovers the job."""
        deadline = time.monotonic() + HAND_BACK_PATIENCE_S
        while time.monotonic() < deadline:
            try:
                logger.info("job %s: handed back: %s", job_id, self.store.hand_back(job_id, self.worker_id))
                return
            except redis.RedisError:
                time.sleep(0.5)
        self.on_fatal(f"job {job_id}: Redis unreachable for {HAND_BACK_PATIENCE_S:.0f} s")
