"""Send the running jobs' output, endings and hand-backs to Redis off the generation loop, in order per job.

One thread, for the worker's life. What the loop hands it within FLUSH_S goes out as one pipeline (one round
trip): per job, the text of that window as one token event, then the job's ending if it came. A job's first
text and every ending go out at once (a client waits on them); the rest waits for the window, so a fast batch
does not pay a round trip per token. Each output write also tells whether its job must stop (cancelled, or no
longer this worker's): the loop is told through `on_stop`.

A job whose client does not read its answer as it is generated (a plain request waits for the whole answer; a
batch's line has no client) is quiet: after its first text, its tokens are held and go out every QUIET_S, with
its ending, or the moment a stream opens on it (`go_live`). Each write is a script in Redis, a message to every
web process and a wake of the job's waiting request; on a CPU the model shares, those cost it tokens, for nothing
a quiet job's client sees. A crash loses at most QUIET_S of a quiet job's tokens, which its next run generates
again (worker/resume.py); its cancel still comes at once, by the worker's listener.

When Redis does not answer (a network blip, a failover), nothing is dropped and nothing is made up: what could not
be written is sent again, first and in order, until it gets there, while the batch goes on. A text write says
where in the run's output it starts, so a retry of a write that did get through (its reply lost) appends only
what is missing. A worker that cannot write for WRITE_PATIENCE_S stops (on_fatal): its lease lapses, and the jobs
are recovered from Redis by whoever comes next.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import redis

from tasks.scripts import AppendReply, FinishReply
from tasks.store import WorkerStore
from worker import timeline
from worker.output_records import Append, Ending, HandBack, Item, Op, Text, queue_write

logger = logging.getLogger(__name__)

FLUSH_S = 0.02
QUIET_S = 1.0  # how often a quiet job's held tokens go out (see above)
RETRY_S = (0.05, 1.0)  # the wait before sending again what Redis did not take: doubling from the first to the second
WRITE_PATIENCE_S = 30.0


class OutputWriter:
    """The writer thread; `begin`, `put_many`, `end` and `hand_back` are called by the loop and never block it.

    The loop wakes the thread only for what must go out at once (a job's first text, an ending, a hand-back) and
    for the first item of a window; the rest waits for the window to close, so a fast batch does not pay a
    thread hand-off per step either.
    """

    def __init__(self, store: WorkerStore, on_stop: Callable[[str], None], on_fatal: Callable[[str], None]) -> None:
        self.store = store
        self.on_stop = on_stop
        self.on_fatal = on_fatal
        self._fresh: set[str] = set()  # jobs none of whose text was handed over yet (the loop's thread only)
        self._handed = threading.Condition()  # guards what follows
        self._pending: list[Item] = []  # handed over, not taken by the writer yet
        self._quiet: set[str] = set()  # running jobs nobody reads live: their tokens are held ...
        self._held: dict[str, list[Text]] = {}  # ... here, per job, in order ...
        self._held_since = 0.0  # ... the oldest since then, going out QUIET_S after
        self._went_live: deque[str] = deque(maxlen=64)  # streams opened on jobs not begun yet (a claim in flight)
        self._urgent = False  # something pending must go out now
        self._writing = False  # the writer is sending what it took
        self._endings_in = self._endings_out = 0  # endings and hand-backs handed over, and written
        self._last_flush = 0.0
        # the writer thread's own:
        self._written: dict[str, tuple[int, int]] = {}  # per running job: its output in Redis (tokens, bytes)
        self._unsent: list[Op] = []  # what Redis did not take: sent again, first
        self._failing_since: float | None = None
        self._retry_s = RETRY_S[0]
        self._closed = False  # close(): the thread ends once it has nothing to write
        self._thread = threading.Thread(target=self._loop, name="output", daemon=True)
        self._thread.start()

    def begin(self, job_id: str, live: bool = True) -> None:
        """A run starts; `live`: its client reads the answer as it is generated (else it is quiet)."""
        self._fresh.add(job_id)
        with self._handed:
            if not live and job_id not in self._went_live:
                self._quiet.add(job_id)

    def go_live(self, job_id: str) -> None:
        """A stream opened on the job (any thread): its held tokens go out now, and the rest as they come."""
        with self._handed:
            if job_id not in self._quiet:
                self._went_live.append(job_id)
                return
            self._quiet.discard(job_id)
            self._release(job_id)
            self._handed.notify_all()

    def put_many(self, texts: list[Text]) -> None:
        """One step's output: a Text for each job that got a token."""
        if not texts:
            return
        urgent, first = False, set()
        for t in texts:
            if t.text and t.job_id in self._fresh:  # its client waits for the first text
                self._fresh.discard(t.job_id)
                urgent = True
                first.add(t.job_id)
        with self._handed:  # (one hand-over a step: _put's lock is this one, taken again by the same thread)
            live: list[Item] = []
            for t in texts:
                if t.n_tokens and t.job_id in self._quiet and t.job_id not in first:
                    if not self._held:  # the first held opens a quiet window: the writer must time it
                        self._held_since = time.monotonic()
                        self._handed.notify_all()
                    self._held.setdefault(t.job_id, []).append(t)
                else:
                    live.append(t)
            if live:
                self._put(live, urgent)

    def end(self, ending: Ending) -> None:
        self._fresh.discard(ending.job_id)
        self._put([ending], True)

    def hand_back(self, job_id: str, why: str, shared: bool = False) -> None:
        """Put a running job back at the front of the queue, after its output so far (see Store.hand_back)."""
        self._fresh.discard(job_id)
        self._put([HandBack(job_id, why, shared)], True)

    def settle(self, timeout_s: float = 30.0) -> bool:
        """Until every ending and hand-back handed over is recorded: a slot goes to the next job only once the job
        that held it has its end in Redis."""
        with self._handed:
            return self._handed.wait_for(lambda: self._endings_out >= self._endings_in, timeout_s)

    def wait_idle(self, timeout_s: float = WRITE_PATIENCE_S) -> bool:
        """Until everything handed over is written, held tokens too (for an orderly stop)."""
        with self._handed:
            if self._held:
                for job_id in list(self._held):
                    self._release(job_id)
                self._urgent = True
                self._handed.notify_all()
            return self._handed.wait_for(lambda: not (self._pending or self._writing or self._unsent), timeout_s)

    def _release(self, job_id: str) -> None:
        """The job's held tokens join what is pending, in their place (under the lock)."""
        self._pending += self._held.pop(job_id, [])

    def _put(self, items: Sequence[Item], urgent: bool) -> None:
        with self._handed:
            wake = urgent or not self._pending  # the first item opens a window: the writer must time it
            for item in items:
                if not isinstance(item, Text):  # its run ends: whatever it holds goes first
                    self._quiet.discard(item.job_id)
                if item.job_id in self._held:  # (a text with no token, or an ending): after what it holds
                    self._release(item.job_id)
            self._pending += items
            self._urgent = self._urgent or urgent
            self._endings_in += sum(1 for item in items if not isinstance(item, Text))
            if wake:
                self._handed.notify_all()

    def close(self) -> None:
        """End the thread once it has nothing to write (after wait_idle: a worker that stopped in good order)."""
        with self._handed:
            self._closed = True
            self._handed.notify_all()

    def _take(self) -> list[Item] | None:
        """Wait for something to write; then, unless it is urgent, for the window to close. With writes to send
        again, wait only until it is time to. None once closed with nothing left."""
        with self._handed:
            self._writing = False
            self._handed.notify_all()  # for wait_idle
            if self._unsent:
                self._handed.wait(self._retry_s)
            else:
                self._handed.wait_for(lambda: self._pending or self._held or self._closed)
                if not (self._pending or self._held):
                    return None
                while not self._urgent and (left := self._due() - time.monotonic()) > 0:
                    self._handed.wait(left)
            if self._held and time.monotonic() >= self._held_since + QUIET_S:
                for job_id in list(self._held):
                    self._release(job_id)
            items, self._pending, self._urgent, self._writing = self._pending, [], False, True
            return items

    def _due(self) -> float:
        """When what waits must go out: the pending at the end of their window, the held at the end of theirs."""
        due = self._last_flush + FLUSH_S if self._pending else float("inf")
        return min(due, self._held_since + QUIET_S) if self._held else due

    def _loop(self) -> None:
        while (items := self._take()) is not None:
            try:
                self._write(items)
            except Exception:  # never let the thread die: the loop would wait on it forever
                logger.exception("output writer: unexpected error")

    def _write(self, items: list[Item]) -> None:
        """What Redis did not take before, then `items`, as one pipeline: per job its text so far as one write,
        before its ending."""
        self._last_flush = time.monotonic()
        ops = [*self._unsent, *self._ops(items)]
        self._unsent = []
        if not ops:
            return
        sent = time.time() if timeline.marks is not None else 0.0
        results = self._send(ops)
        if timeline.marks is not None and results is not None:
            _mark_first_writes(ops, sent)
        if results is None:  # Redis did not answer: it may or may not have run them; send them all again
            self._unsent = ops
            self._wait_longer()
            return
        self._failing_since, self._retry_s = None, RETRY_S[0]
        for op, result in zip(ops, results):
            if isinstance(result, redis.exceptions.NoScriptError):  # Redis forgot the scripts (a restart)
                self._unsent.append(op)  # it did not run: send it again once they are loaded
            else:
                self._settle(op, result)
        if self._unsent:
            with contextlib.suppress(redis.RedisError):
                self.store.scripts.load()

    def _ops(self, items: list[Item]) -> list[Op]:
        """The items as writes: a job's texts in a row as one, each placed after what is written of its run."""
        texts: dict[str, Text] = {}  # job id -> its text so far, in order of arrival
        ops: list[Op] = []
        for item in items:
            if isinstance(item, Text):
                texts[item.job_id] = texts[item.job_id] + item if item.job_id in texts else item
            else:
                if item.job_id in texts:
                    ops.append(self._append(texts.pop(item.job_id)))
                ops.append(item)
        return ops + [self._append(text) for text in texts.values()]

    def _append(self, text: Text) -> Append:
        op = Append(text, text.resume_at or self._written.get(text.job_id, (0, 0)))
        self._written[text.job_id] = op.end
        return op

    def _wait_longer(self) -> None:
        now = time.monotonic()
        self._failing_since = self._failing_since or now
        self._retry_s = min(self._retry_s * 2, RETRY_S[1])
        if now - self._failing_since > WRITE_PATIENCE_S:
            self.on_fatal(f"Redis took no output for {WRITE_PATIENCE_S:.0f} s")

    def _send(self, ops: list[Op]) -> list[Any] | None:
        """The ops as one pipeline (one round trip); each op's reply, or the error it met; None if Redis did not
        answer."""
        pipe = self.store.redis.pipeline(transaction=False)
        for op in ops:
            queue_write(self.store, op, pipe)
        try:
            return list(pipe.execute(raise_on_error=False))
        except redis.RedisError as exc:
            logger.warning("writing output failed (%s): %d write(s) will be sent again", exc, len(ops))
            return None

    def _settle(self, op: Op, result: Any) -> None:
        """Act on one write's reply."""
        if isinstance(result, Exception):  # the script failed (a bug, not Redis away): the operator's to see
            logger.error("job %s: %s failed: %s", op.job_id, type(op).__name__.lower(), result)
        if isinstance(op, Append):
            if result == AppendReply.STOP:
                self.on_stop(op.job_id)
            elif result == AppendReply.GAP:  # sent in order, so a gap means what came before it was lost: say so
                logger.error("job %s: a write did not follow what Redis holds of its output; dropped", op.job_id)
            return
        self._written.pop(op.job_id, None)  # the run is over
        if isinstance(op, Ending) and (result == FinishReply.NOT_ASKED or isinstance(result, Exception)):
            # not ended: say, `cancelled`, which nobody asked for. Never made up: the job goes back to the queue
            logger.error("job %s: its ending was refused (%s); handing it back", op.job_id, result)
            self._unsent.append(HandBack(op.job_id, "worker_crashed", False))
            return
        if isinstance(op, Ending) and result == FinishReply.NOT_HERE:
            logger.warning("job %s: taken away from this worker (presumed dead); its outcome was dropped", op.job_id)
        elif isinstance(op, HandBack):
            logger.info("job %s: handed back: %s", op.job_id, result[1] if result else "not running here")
        with self._handed:
            self._endings_out += 1
            self._handed.notify_all()


def _mark_first_writes(ops: list[Op], sent: float) -> None:
    """For a benchmark (worker/timeline.py): when each run's first tokens were sent to Redis, and written."""
    written = time.time()
    for op in ops:
        if isinstance(op, Append) and op.text.n_tokens and op.start[0] == 0:
            timeline.mark(op.job_id, "sent", sent)
            timeline.mark(op.job_id, "written", written)
