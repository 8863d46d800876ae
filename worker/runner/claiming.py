"""The next job claimed, in fair order (tasks/lua/claim.lua): into an empty batch, any job; else the queue's head,
measured (its prompt's tokens, its KV cost) and checked against what this model can do, named in the claim once
it fits the batch, or once batch work is set aside for it (worker/runner/preemption.py). A job of another model
waits for the batch to drain and its model to load."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from tasks.context import Window
from tasks.errors import ContextLengthExceeded, InvalidPrompt, LeaseLost
from tasks.model_kind import NAMES
from tasks.scheduling import fits
from tasks.store import Claim, Switch, WorkerStore
from worker.batch.engine import Engine
from worker.models import ModelPool
from worker.pooling import Pooler
from worker.runner.members import Members
from worker.runner.preemption import Preemption
from worker.runner.runs import Head, generation_error
from worker.vision_prep import Preparing

logger = logging.getLogger(__name__)


class Claiming:
    """The claim of the next job, in fair order: the queue's head measured (once) and named once it fits, the
    model loaded that the next job needs, batch work set aside for interactive work (`preemption`). It holds the
    head, measured, while it waits for room in the batch."""

    def __init__(
        self,
        store: WorkerStore,
        models: ModelPool,
        members: Members,
        preemption: Preemption,
        queue_moved: threading.Event,
        on_fatal: Callable[[str], None],
    ) -> None:
        self.store = store
        self.models = models
        self.members = members
        self.preemption = preemption
        self.queue_moved = queue_moved  # set once a head's images are prepared: it may be claimed then
        self.on_fatal = on_fatal  # (the lease is lost: the claim says so)
        self._head: Head | None = None  # the queue's head, measured, waiting for room in the batch

    @property
    def budget(self) -> int:
        return self.store.settings.kv_budget_tokens

    def claim(self) -> Claim | Switch | None:
        """The next claim: any job into an empty batch; else the measured head, named if it fits now. None when
        nothing waits, or Redis does not answer (the batch goes on; housekeeping rings again once Redis answers)."""
        batch = self.members.batch
        if not batch:
            want: str | None = "*"  # any job fits an empty batch: claim it in one round trip
        else:
            want = self._head.id if self._head and self.fits(self._head) else None
        try:
            claim = self.store.claim_next(
                want=want,
                active=self.members.active if batch else "",
                loaded=self.models.names(),
                urgent=self._urgent(),
            )
        except redis.RedisError as exc:
            logger.warning("cannot claim: %s", exc)
            return None
        except LeaseLost as exc:  # the lease lapsed, or another worker holds it: this batch is no longer ours
            self.on_fatal(exc.message)
            return None
        if claim is None:
            self._head = None
        return claim

    def _urgent(self) -> bool:
        """Whether the claim names the first interactive job waiting (Preemption.urgent): the batch is full."""
        batch, engine = self.members.batch, self.members.engine
        if not batch or engine is None:
            return self.preemption.urgent(full=False)
        full = len(batch) >= engine.max_batch or (self._head is not None and not self.fits(self._head))
        return self.preemption.urgent(full)

    def switch(self, switch: Switch) -> bool:
        """The next job needs another model: with the batch empty, load it and claim again (a failed load fails
        the model's jobs: the claim moves on); else the batch drains first (a job leaving it looks again)."""
        members = self.members
        if switch.load and switch.side:  # a pooled job's model loads beside the batch, which stays
            logger.info("job %s needs model %s: loading it beside the batch", switch.head, switch.model)
            if not members.batch:
                members.engine = None  # held here, an evicted model's weights could not be freed
            self.models.load(switch.model, keep=members.active if members.batch else "")
            return True
        if switch.load and not members.batch:
            logger.info("job %s needs model %s: loading it", switch.head, switch.model)
            members.engine = None  # held here, an evicted model's weights could not be freed
            self.models.load(switch.model)
            return True
        self._head = None
        return False

    def consider(self, claim: Claim) -> bool:
        """The head, not claimed: measure it (once), and claim it by name if it fits now, or once batch-class work
        is set aside for it (an interactive job); else it waits until a job leaves the batch."""
        if self._head is None or self._head.id != claim.job.id or self._head.preparing:
            self._head = self._measure(claim)
        if self._head.preparing:  # it is claimed once its images are prepared (the queue moves then)
            return False
        return self.fits(self._head) or self.preemption.make_room(claim.job, self._head)

    def take(self, claim: Claim) -> Head:
        """A started job's measure, to join the batch (the head's, or taken now: claimed into an empty batch); the
        head is measured again after it."""
        head, self._head = self._head, None
        if head is None or head.id != claim.job.id or head.preparing:
            head = self._measure(claim, wait=True)
        return head

    def forget_head(self) -> None:
        """A job started beside the batch (pooled work): the head is measured again, as after a job that joins."""
        self._head = None

    def _measure(self, claim: Claim, wait: bool = False) -> Head:
        """A job measured (see the module's docstring); one whose images are being prepared is `preparing`, unless
        `wait` (it was claimed: it joins now)."""
        job = claim.job
        if job.spec.side:  # read beside the batch: it takes no slot nor KV budget
            return Head(id=job.id, tokens=[], cost=0, solo=False, side=True)
        engine = self.models.get(job.spec.model) or self.models.load(job.spec.model)
        if engine is None:
            why = self.store.load_error(job.spec.model) or "the model failed to load"
            return Head(id=job.id, tokens=[], cost=0, solo=claim.solo, invalid=("model_unavailable", why))
        if isinstance(engine, Pooler):  # (admitted under an older models file: the web routes each kind)
            why = f"the model {job.spec.model} is {NAMES[engine.kind]}: it generates no text"
            return Head(id=job.id, tokens=[], cost=0, solo=claim.solo, invalid=("model_unavailable", why))
        digests = [p.digest for m in job.spec.messages or () for p in m.images]
        key = self.store.settings.prefix_key(job.spec.model, job.owner)
        try:
            tokens = engine.prompt_tokens(
                job.spec,
                (lambda: self.store.images(digests)) if digests else None,  # (read off the device, if needed)
                wait=wait or not self.members.batch,  # (an empty batch has nothing to step meanwhile)
                reach=lambda t: self.models.prefix.reach(key, t, engine.marks(t)),
            )
        except Preparing as exc:  # its images are prepared away from the device: the batch steps meanwhile
            exc.future.add_done_callback(lambda _: self.queue_moved.set())
            return Head(id=job.id, tokens=[], cost=0, solo=claim.solo, preparing=True)
        except InvalidPrompt as exc:
            return Head(id=job.id, tokens=[], cost=0, solo=claim.solo, invalid=(exc.type, exc.message))
        except Exception:  # the details are for the operator's log, not for the client
            logger.exception("job %s: its prompt could not be prepared", job.id)
            return Head(id=job.id, tokens=[], cost=0, solo=claim.solo, invalid=generation_error(job.id))
        return self._sized(claim, engine, tokens)

    def _sized(self, claim: Claim, engine: Engine, tokens: list[int]) -> Head:
        """A measured job: its answer no longer than its prompt leaves of the context, its KV cost; or, if its prompt
        does not fit (tasks/context.py), refused: the web counts most prompts as it admits them, not a batch's line,
        one it could not count in time, nor one with images."""
        job, window = claim.job, Window(engine.context, self.budget)
        try:
            window.check(len(tokens), param="prompt" if job.spec.prompt is not None else "messages")
        except ContextLengthExceeded as exc:
            logger.info("job %s: refused, its %d prompt tokens do not fit its model", job.id, len(tokens))
            return Head(id=job.id, tokens=[], cost=0, solo=claim.solo, invalid=(exc.type, exc.message, exc.param or ""))
        answer = window.answer(len(tokens), job.spec.params.max_tokens)
        cost = len(tokens) + answer
        solo = claim.solo or engine.runs_alone(tokens)  # (it waits for the batch to drain, and none joins it)
        return Head(id=job.id, tokens=tokens, cost=min(cost, engine.max_kv_size or cost), solo=solo, max_tokens=answer)

    def fits(self, head: Head) -> bool:
        """A job joins if the budget holds it, or if the batch is empty (a job too big for the budget runs alone);
        one that must run alone waits for the batch to drain."""
        batch, engine = self.members.batch, self.members.engine
        if head.preparing:
            return False
        if not batch or head.side:
            return True
        assert engine is not None  # (a batch with jobs in it has its model's engine)
        room = len(batch) < engine.max_batch and not batch.solo
        return room and not head.solo and fits(head.cost, batch.costs(), self.budget)
