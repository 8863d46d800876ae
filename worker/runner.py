"""Run jobs as one continuous batch: claim in fair order while a slot and the KV budget allow, advance every job by
one token per step, and record exactly one outcome per job.

The batch runs one model at a time (the `active` one). A job of another model waits for the batch to drain and its
model to be ready; meanwhile jobs of a ready model may go ahead of it within ONELANE_MODEL_SWITCH_WAIT_S (the claim
decides: tasks/lua/claim.lua), so mixed traffic does not switch models at every job.

The loop owns the engine (one thread, one step at a time on the device). It never waits on Redis while jobs
generate, except to claim: output, endings and hand-backs go through the writer's thread, in order per job.
Before every step it drops the jobs that must stop (cancelled, client gone, taken away, over their time limit),
so a stopped job gets no token from the step after the one in which its stop was heard.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable

import redis

from tasks.errors import InvalidPrompt, InvalidRequest, LeaseLost
from tasks.job import Job, JobStatus, SamplingParams
from tasks.logprobs import TokenLogprob
from tasks.model_kind import NAMES
from tasks.settings import PREFILL_BATCH
from tasks.store import Claim, Switch, WorkerStore
from worker import timeline
from worker.batch import Batch, Finished, Head, Running, StepResult
from worker.choices import Groups, Held
from worker.engine import KV, Engine, Scorer, Token
from worker.grammar import Constraint, GrammarError
from worker.logits import vocabulary
from worker.models import ModelPool
from worker.output import Ending, OutputWriter, Text
from worker.pooling import Pooler, SideWork
from worker.prefix_cache import Hit
from worker.resume import fresh, resume
from worker.step_watch import StepWatch

logger = logging.getLogger(__name__)

SETTLE_S = 0.05  # how long a step waits for the endings before it to be recorded, before it claims
SETTLE_IDLE_S = 1.0  # ... with nothing in the batch
PROGRESS_S = 1.0  # how often a job that makes no token (its prompt is read) tells it progresses (at most)
PAUSE_S = 5.0  # a gap this long between two steps is a pause (the batch was empty), not a slow step
NO_STEP = ("", 0, 0, 0.0)


class Runner:
    """Runs jobs for one worker process, through its verbs of the store (bound to its id: the device's lease holder).

    One thread runs the loop (`run_waiting`) and owns everything here; other threads only call `request_stop`, set
    `queue_moved`, and read `batch`, `engine`, `active` and `pace` for the heartbeat's report.
    """

    def __init__(self, store: WorkerStore, models: ModelPool, on_fatal: Callable[[str], None]) -> None:
        self.store = store
        self.on_fatal = on_fatal
        self.models = models
        self.engine: Engine | None = None  # the active model's: the one the batch runs
        self.active = ""
        self.batch = Batch()
        self.queue_moved = threading.Event()  # set by the worker's listener: jobs may wait to be claimed
        self._stops: queue.SimpleQueue[Running] = queue.SimpleQueue()  # runs that must stop; the loop alone reads it
        # the loop's view of the queue (its thread alone uses these):
        self._look = True  # it may hold a job that can join now: set when it moves or a job leaves, cleared by `_fill`
        self._head: Head | None = None  # its head, measured, waiting for room in the batch
        self._set_aside: list[str] = []  # batch-class jobs taken out for an interactive one: handed back once it joins
        self.writer = OutputWriter(store, on_stop=self.request_stop, on_fatal=on_fatal)
        self.groups = Groups()  # the requests of several answers with a run in the batch (worker/choices.py)
        self.scoring: dict[str, tuple[Running, Scorer, SamplingParams]] = {}  # runs reading their prompt to score it
        self.pace = models.pace  # how fast each model's steps go here (the heartbeat reports it, for ETAs)
        self.watch = StepWatch()  # the step on the device, and how long it may run (the heartbeat reports it)
        self._last_step = NO_STEP  # the step before: its model, sequences, prompt tokens, when it started
        self._deferred: list[list[Running]] = []  # suspects of a failed step kept out of the engine (see _step_failed)
        self.side = SideWork()  # pooled jobs (embeddings, rerank) claimed: read a pass at a time between steps
        self._side_stops: queue.SimpleQueue[str] = queue.SimpleQueue()  # pooled jobs that must stop

    @property
    def budget(self) -> int:
        return self.store.settings.kv_budget_tokens

    def request_stop(self, job_id: str) -> None:
        """Stop a job's run in the batch before the next step (from the cancel listener, or the writer: any
        thread). The request is for the run going on now: once that run has ended, it is void (the job may have
        been handed back and be running again). A job not in the batch yet hears it from its first output write."""
        r = self.batch.by_job.get(job_id)
        if r is None:
            if job_id in self.side.runs:
                self._side_stops.put(job_id)
            return
        if r.stop_seen_at is None:
            r.stop_seen_at = r.tokens
        self._stops.put(r)

    def run_waiting(self, stopping: threading.Event) -> int:
        """Run the batch until nothing runs and nothing that can run waits; returns how many jobs started.

        A job joins the moment a slot (and room in the KV budget) is free, and the next one is claimed as soon as
        one ends: on a GPU, any gap is throughput lost. Once `stopping` is set nothing more is claimed; the jobs
        in the batch have ONELANE_DRAIN_S to end, then the rest go back to the front of the queue (that run not
        counted as an attempt) for the next worker.
        """
        started = 0
        drain_until: float | None = None
        with self.models.lock:
            self._look = True
            while True:
                if stopping.is_set() and (self.batch or self.side):
                    drain_until = drain_until or time.monotonic() + self.store.settings.drain_s
                    if time.monotonic() > drain_until:
                        self._hand_back_all("stopping")
                        return started
                if self.queue_moved.is_set():
                    self.queue_moved.clear()
                    self._look = True
                if self._look and not stopping.is_set():
                    started += self._fill()
                self._drop_stopped()
                self._drop_side_stopped()
                if self.side:  # a pass of pooled work, then the batch's step: each waits one of the other at most
                    self._side_step()
                if self.batch:
                    self._step()
                    continue
                if self.side:
                    continue
                self._last_step = NO_STEP  # (the next step's clock starts with it)
                if not self._look or stopping.is_set():  # nothing runs, and none may join (else: look again)
                    return started

    # --- joining: one claim after another, each outcome to its handler -------------------------------------

    def _fill(self) -> int:
        """Claim jobs in fair order while one can join; returns how many started. The queue is not looked at
        again until it moves or a job leaves the batch."""
        started = 0
        # a slot goes to the next job only once the job that held it has its end in Redis: a moment, unless Redis is
        # away (the batch goes on meanwhile, and the queue is looked at again after the next step)
        if not self.writer.settle(SETTLE_S if self.batch else SETTLE_IDLE_S):
            return 0
        while self._has_slot():
            claim = self._claim()
            if claim is None:
                break
            if isinstance(claim, Switch):
                go_on = self._on_switch(claim)
            elif claim.started:
                self._join(claim)
                started += 1
                go_on = bool(claim.behind)  # nothing else waits: no need to ask again until the queue moves
            else:
                go_on = self._on_head(claim)
            if not go_on:
                break
        for job_id in self._set_aside:  # (after the claim: it comes before them in the queue, whatever their scores)
            self.writer.hand_back(job_id, "preempted")
        self._set_aside.clear()
        self._look = False
        return started

    def _has_slot(self) -> bool:
        """Whether a job may be claimed: any job into an empty batch; else the head, if it fits (_fits)."""
        return not self._deferred  # a failed step's cause is being looked for: no newcomer muddles it

    def _claim(self) -> Claim | Switch | None:
        """The next claim: any job into an empty batch; else the measured head, named if it fits now. None when
        nothing waits, or Redis does not answer (the batch goes on; housekeeping rings again once Redis answers)."""
        if not self.batch:
            want: str | None = "*"  # any job fits an empty batch: claim it in one round trip
        else:
            want = self._head.id if self._head and self._fits(self._head) else None
        try:
            claim = self.store.claim_next(
                want=want,
                active=self.active if self.batch else "",
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

    def _on_switch(self, switch: Switch) -> bool:
        """The next job needs another model: with the batch empty, load it and claim again (a failed load fails
        the model's jobs: the claim moves on); else the batch drains first (a job leaving it looks again)."""
        if switch.load and switch.side:  # a pooled job's model loads beside the batch, which stays
            logger.info("job %s needs model %s: loading it beside the batch", switch.head, switch.model)
            if not self.batch:
                self.engine = None  # held here, an evicted model's weights could not be freed
            self.models.load(switch.model, keep=self.active if self.batch else "")
            return True
        if switch.load and not self.batch:
            logger.info("job %s needs model %s: loading it", switch.head, switch.model)
            self.engine = None  # held here, an evicted model's weights could not be freed
            self.models.load(switch.model)
            return True
        self._head = None
        return False

    def _on_head(self, claim: Claim) -> bool:
        """The head, not claimed: measure it (once), and claim it by name if it fits now, or once batch-class work
        is set aside for it (an interactive job); else it waits until a job leaves the batch."""
        if self._head is None or self._head.id != claim.job.id:
            self._head = self._measure(claim)
        return self._fits(self._head) or self._preempt_for(claim.job, self._head)

    # --- preemption: interactive work never waits behind batch work ------------------------------------------

    def _victims(self) -> list[Running]:
        """The batch-class runs that may be set aside, the cheapest first (the fewest KV tokens to keep and read
        again): in the engine, not stopping, not one of several answers, set aside fewer than ONELANE_PREEMPT_LIMIT
        times."""
        limit = self.store.settings.preempt_limit
        if not limit or self.batch.solo or self._deferred:
            return []
        runs = [
            r
            for r in self.batch.by_uid.values()
            if r.job.spec.priority == "batch"
            and r.uid >= 0
            and r.stop_seen_at is None
            and r.job.preemptions < limit
            and r.job.spec.choice is None
            and r.job.id not in self.scoring
            and r.job.id not in self._set_aside
        ]
        return sorted(runs, key=lambda r: r.prompt_tokens + r.tokens)

    def _urgent(self) -> bool:
        """Whether the batch has no room and holds batch-class work to set aside for an interactive job: the claim
        then names the first interactive job waiting, not a batch-class head (tasks/lua/claim.lua)."""
        if self._set_aside:  # (room was made for one: it is claimed next)
            return True
        if not self.batch or self.engine is None:
            return False
        full = len(self.batch) >= self.engine.max_batch or (self._head is not None and not self._fits(self._head))
        return full and bool(self._victims())

    def _preempt_for(self, job: Job, head: Head) -> bool:
        """Make room for an interactive head by setting batch-class runs aside, the cheapest first, as few as it
        takes; False (none set aside) if even all of them would not make room."""
        if job.spec.priority == "batch" or head.solo or head.side or head.invalid is not None or not self.batch:
            return False
        assert self.engine is not None
        chosen: list[Running] = []
        for r in self._victims():
            chosen.append(r)
            left = len(self.batch) - len(chosen)
            if left < self.engine.max_batch and self.batch.kv_tokens_with(head.cost, tuple(chosen)) <= self.budget:
                break
        else:
            return False
        for r in chosen:
            self._preempt(r, head.id)
        return True

    def _preempt(self, r: Running, for_job: str) -> None:
        """Set a run aside: its KV state to the prefix cache (where its byte budget allows), out of the batch; it is
        handed back to the queue once the job it made room for has joined (_fill), not counted as an attempt, and
        its next run goes on from its tokens, as after any hand-back (worker/resume.py)."""
        assert self.engine is not None
        kv = self.engine.remove([r.uid], keep=True).get(r.uid)
        kept = kv is not None and self.models.prefix.insert(r.cache_key, kv.tokens, kv.cache)
        self.batch.drop(r)
        self._set_aside.append(r.job.id)
        logger.info(
            "job %s: set aside for interactive job %s after %d tokens (preemption %d; its KV state %s)",
            r.job.id,
            for_job,
            r.tokens,
            r.job.preemptions + 1,
            "kept" if kept else "not kept",
        )

    def _measure(self, claim: Claim) -> Head:
        job = claim.job
        if job.spec.side:  # read beside the batch: it takes no slot nor KV budget
            return Head(job.id, [], 0, False, side=True)
        engine = self.models.get(job.spec.model) or self.models.load(job.spec.model)
        if engine is None:
            return Head(job.id, [], 0, claim.solo, invalid=("model_unavailable", "the model failed to load"))
        if isinstance(engine, Pooler):  # (admitted under an older models file: the web routes each kind)
            why = f"the model {job.spec.model} is {NAMES[engine.kind]}: it generates no text"
            return Head(job.id, [], 0, claim.solo, invalid=("model_unavailable", why))
        digests = [p.digest for m in job.spec.messages or () for p in m.images]
        try:
            tokens = engine.prompt_tokens(job.spec, self.store.images(digests) if digests else None)
        except InvalidPrompt as exc:
            return Head(job.id, [], 0, claim.solo, invalid=(exc.type, exc.message))
        except Exception:  # the details are for the operator's log, not for the client
            logger.exception("job %s: its prompt could not be prepared", job.id)
            return Head(job.id, [], 0, claim.solo, invalid=_generation_error(job.id))
        cost = len(tokens) + job.spec.params.max_tokens
        return Head(job.id, tokens, min(cost, engine.max_kv_size or cost), claim.solo)

    def _fits(self, head: Head) -> bool:
        """A job joins if the budget holds it, or if the batch is empty (a job too big for the budget runs alone);
        one that must run alone waits for the batch to drain."""
        if not self.batch or head.side:
            return True
        room = len(self.batch) < self.engine.max_batch and not self.batch.solo  # type: ignore[union-attr]
        return room and not head.solo and self.batch.kv_tokens_with(head.cost) <= self.budget

    def _join(self, claim: Claim) -> None:
        """A started job joins the batch (measured as the head, or now: claimed into an empty batch), or fails at
        once if it cannot be generated from."""
        job, head = claim.job, self._head
        self._head = None
        if head is None or head.id != job.id:
            head = self._measure(claim)
        if head.side:
            self._count(job) if job.spec.count else self._take_pooled(job)
            return
        if not self.batch and head.invalid is None:
            self._activate(job.spec.model)
        logger.info(
            "job %s: started (owner %s, model %s, attempt %d, batch %d)",
            job.id,
            job.owner,
            job.spec.model,
            job.attempts,
            len(self.batch) + 1,
        )
        if head.invalid is None:
            head.invalid = self._unfit(job)
        if head.invalid is not None:
            self.writer.end(Ending(job_id=job.id, status=JobStatus.FAILED, error=head.invalid))
            return
        assert self.engine is not None
        params, done = _sampling(job), claim.delivered.ids if claim.delivered else ()
        self.writer.begin(job.id, live=claim.live)
        try:
            constraint = self._constraint(job, done)
        except GrammarError as exc:  # admission checked it without the tokenizer; this tokenizer cannot
            self.writer.end(Ending(job_id=job.id, status=JobStatus.FAILED, error=("invalid_schema", str(exc)[:500])))
            return
        complete = constraint is not None and constraint.done  # its earlier run completed the grammar
        start = (
            resume(self.engine.detokenizer(), params, claim.delivered, self.engine.eos, complete)
            if claim.delivered
            else fresh(self.engine.detokenizer(), params)
        )
        if done:
            logger.info("job %s: goes on from the %d tokens its earlier runs generated", job.id, len(done))
        if start.ended:  # its earlier run generated it whole: only its ending was lost
            self.writer.put_many(
                [Text(job_id=job.id, text=start.rest, prompt_tokens=len(head.tokens), resume_at=start.at)]
            )
            self.writer.end(
                Ending(
                    job_id=job.id,
                    status=JobStatus.COMPLETED,
                    finish_reason=start.ended,
                    prompt_tokens=len(head.tokens),
                    completion_tokens=len(done),
                )
            )
            return
        limit_s = self.store.settings.job_time_limit_s
        key = self.store.settings.prefix_key(job.spec.model, job.owner)
        run = Running(
            job=job,
            uid=0,
            prompt_tokens=len(head.tokens),
            cost=head.cost,
            deadline=time.monotonic() + limit_s,
            detokenizer=start.detokenizer,
            stops=start.stops,
            solo=head.solo,
            tokens=len(done),
            cache_key=key,
            constraint=constraint,
            answer=[claim.delivered.text] if claim.delivered else [],
            prompt=head.tokens,
            ids=list(done),
        )
        if params.prompt_logprobs and not job.prompt_logprobs:  # (a run after a requeue has them already)
            self.scoring[job.id] = (run, self.engine.scorer(head.tokens, params.top_logprobs), params)
            run.uid = self.batch.hold_uid()  # in the batch, not in the engine, while it is read
            self.batch.add(run)
        elif params.max_tokens == 0:  # its earlier run scored its prompt; only its ending was lost
            self.writer.end(
                Ending(
                    job_id=job.id, status=JobStatus.COMPLETED, finish_reason="length", prompt_tokens=len(head.tokens)
                )
            )
            return
        elif not self._place(run, head.tokens, params, self.models.prefix.fetch(key, [*head.tokens, *done]), done):
            return
        if run.cached:
            logger.info("job %s: %d of its %d prompt tokens read before", job.id, run.cached, len(head.tokens))
        # its prompt and what of it is cached, recorded at once: estimates count only the prefill still to do
        self.writer.put_many([run.text(start.rest, resume_at=start.at)])

    def _count(self, job: Job) -> None:
        """A count of a prompt's tokens (Anthropic's count_tokens): its model's tokenizer reads it, nothing runs on
        the device; it completes at once, its prompt_tokens the count."""
        engine = self.models.get_quietly(job.spec.model) or self.models.load(job.spec.model, keep=self.active)
        if not isinstance(engine, Engine):
            why = "the model failed to load" if engine is None else f"the model {job.spec.model} generates no text"
            self.writer.end(Ending(job_id=job.id, status=JobStatus.FAILED, error=("model_unavailable", why)))
            return
        digests = [p.digest for m in job.spec.messages or () for p in m.images]
        self.writer.begin(job.id, live=False)
        try:
            tokens = engine.prompt_tokens(job.spec, self.store.images(digests) if digests else None)
        except InvalidPrompt as exc:
            self.writer.end(Ending(job_id=job.id, status=JobStatus.FAILED, error=(exc.type, exc.message)))
            return
        except Exception:  # the details are for the operator's log, not for the client
            logger.exception("job %s: its prompt could not be prepared", job.id)
            self.writer.end(Ending(job_id=job.id, status=JobStatus.FAILED, error=_generation_error(job.id)))
            return
        self.writer.end(
            Ending(job_id=job.id, status=JobStatus.COMPLETED, finish_reason="stop", prompt_tokens=len(tokens))
        )
        logger.info("job %s: counted (%d prompt tokens)", job.id, len(tokens))
        self._look = True

    def _take_pooled(self, job: Job) -> None:
        """A started pooled job joins the side work (worker/pooling.py), or fails at once if its model cannot read
        its inputs."""
        pooler = self.models.pooler(job.spec.model) or self.models.load(job.spec.model, keep=self.active)
        logger.info(
            "job %s: started (owner %s, model %s, attempt %d, pooled)", job.id, job.owner, job.spec.model, job.attempts
        )
        if not isinstance(pooler, Pooler):
            self.writer.end(
                Ending(job_id=job.id, status=JobStatus.FAILED, error=("model_unavailable", "the model failed to load"))
            )
            return
        self.writer.begin(job.id, live=False)
        try:
            self.side.add(job, pooler)
        except InvalidRequest as exc:
            self.writer.end(
                Ending(job_id=job.id, status=JobStatus.FAILED, error=(exc.type, exc.message, exc.param or ""))
            )

    def _side_step(self) -> None:
        """One pass of pooled work; the jobs it completed are answered (their vectors or scores, as one text)."""
        done, failed = self.side.step()
        self._last_step = NO_STEP  # (the pass is no part of the batch's step it comes before)
        for run in done:
            try:
                output = run.output()
            except InvalidRequest as exc:
                self.writer.end(
                    Ending(job_id=run.job.id, status=JobStatus.FAILED, error=(exc.type, exc.message, exc.param or ""))
                )
                continue
            self.writer.put_many([Text(job_id=run.job.id, text=output, prompt_tokens=run.tokens)])
            self.writer.end(
                Ending(job_id=run.job.id, status=JobStatus.COMPLETED, finish_reason="stop", prompt_tokens=run.tokens)
            )
            logger.info("job %s: completed (%d inputs, %d tokens read)", run.job.id, len(run.sequences), run.tokens)
        for run in failed:
            self.writer.end(Ending(job_id=run.job.id, status=JobStatus.FAILED, error=_generation_error(run.job.id)))
        self._look = self._look or bool(done or failed)

    def _drop_side_stopped(self) -> None:
        while not self._side_stops.empty():  # this loop is the only reader
            job_id = self._side_stops.get_nowait()
            if self.side.drop(job_id) is not None:
                self.writer.end(Ending(job_id=job_id, status=JobStatus.CANCELLED, finish_reason="cancelled"))
                logger.info("job %s: cancelled (pooled)", job_id)

    def _score(self) -> None:
        """Read a chunk of the prompt of the first job that scores its prompt (echo); once read, its log
        probabilities are written, and it ends (max_tokens 0) or goes on to generate, its prompt's KV state read."""
        if not self.scoring:
            return
        job_id, (run, scorer, params) = next(iter(self.scoring.items()))
        try:
            scorer.advance()
        except Exception:  # read outside the batch, with a KV cache of its own: its failure is its own alone
            logger.exception("job %s: reading its prompt to score it failed", job_id)
            self._end(run, None, error=_generation_error(job_id))
            return
        if not scorer.done:
            return
        del self.scoring[job_id]
        self.writer.put_many([run.text("", prompt_logprobs=scorer.entries)])
        if params.max_tokens == 0:
            self._end(run, "length")
            return
        self.batch.drop(run)
        self._place(run, scorer.prompt, params, Hit(scorer.cache, len(scorer.prompt) - 1), ())

    def _place(self, run: Running, prompt: list[int], params: SamplingParams, hit: Hit, done: tuple[int, ...]) -> bool:
        """Put a run in the batch: into the engine, from what of its prompt is read already (`hit`), or held until
        another answer of its request has read their common prompt (worker/choices.py). False if its prompt cannot
        be read (its images' embeddings could not be made: it failed)."""
        assert self.engine is not None
        choice = run.job.spec.choice if not done else None  # (a run after a requeue goes on from its own tokens)
        group = self.groups.get(choice.group) if choice else None
        if group is not None and group.prompt == prompt and hit.tokens < len(prompt) - 1:
            if group.leader is not None:  # being read: wait for it
                self.groups.hold(group, Held(run, prompt, params))
                run.uid = self.batch.hold_uid()
                self.batch.add(run)
                return True
            if group.cache is not None:
                hit = Hit(group.copy(), len(prompt) - 1)
        try:
            run.uid = self.engine.insert(
                prompt, params, hit.cache, hit.tokens, generated=done, constraint=run.constraint
            )
        except InvalidPrompt as exc:  # (worker/vision.py: the images of its prompt are no longer held)
            self.writer.end(Ending(job_id=run.job.id, status=JobStatus.FAILED, error=(exc.type, exc.message)))
            self._look = True
            return False
        timeline.mark(run.job.id, "joined")
        run.cached = min(hit.tokens, len(prompt))  # (of the prompt's)
        self.batch.add(run)
        if choice is None:
            return True
        if group is None and hit.tokens < len(prompt) - 1:  # the first of its request: it reads the prompt
            self.groups.lead(choice.group, run, prompt)
        elif group is not None:
            self.groups.join(group, run)
        return True

    def _read_prompts(self, uids: set[int]) -> None:
        """The groups whose leader made its first token in this step: their held runs join, their prompt read."""
        assert self.engine is not None
        for group in self.groups.read(uids):
            leader = group.leader
            assert leader is not None
            for held in self.groups.release(group, self.engine.extract(leader.uid, len(group.prompt) - 1)):
                self.batch.drop(held.run)
                cached = len(group.prompt) - 1 if group.cache is not None else 0
                self._place(held.run, held.prompt, held.params, Hit(group.copy(), cached), ())

    def _unfit(self, job: Job) -> tuple[str, ...] | None:
        """Why the job's request cannot be generated from on this model, though it passed admission."""
        bias, e = job.spec.params.logit_bias, self.engine
        vocab = vocabulary(e.tokenizer, e.vocab) if bias and e is not None else 0
        beyond = sorted(t for t in bias if t >= vocab)
        if beyond:
            why = f"logit_bias names token {beyond[0]}; the model's vocabulary has {vocab} tokens"
            return "invalid_request", why, "logit_bias"
        return None

    def _constraint(self, job: Job, done: tuple[int, ...]) -> Constraint | None:
        """The job's grammar's matcher (None: its answer is free), past the tokens its earlier runs generated."""
        if job.spec.constraint is None:
            return None
        assert self.engine is not None
        return self.engine.grammars.constrain(job.spec.constraint.grammar, done)

    def _activate(self, model: str) -> None:
        """The batch's model is its first job's."""
        if model != self.active:
            logger.info("batch switches to model %s (from %s)", model, self.active or "none")
            self.store.upkeep.count("model_switches")
        self.active, self.engine = model, self.models.get(model)

    # --- generating ----------------------------------------------------------------------------------------

    def _step(self) -> None:
        """One step of the batch: every job's new text in one hand-over, then the endings of the jobs that ended
        (after their last text), then those over their time limit."""
        assert self.engine is not None
        self._timed_step(time.perf_counter())
        began = time.time() if timeline.steps is not None else 0.0
        self._score()
        n = len(self.batch)
        self.watch.start(self.pace.speed(self.active), n, self.engine.prefill_step * min(n, PREFILL_BATCH))
        try:
            tokens = self.engine.step()
        except Exception:  # the batch's state cannot be trusted: start it afresh, and find the cause
            logger.exception("a batch step failed with %d job(s) in the batch", len(self.batch))
            self._step_failed()
            return
        finally:
            self.watch.stop()
        if timeline.steps is not None:
            self._record_step(began, tokens)
        self._last_step = (self.active, len(tokens), self.engine.padded_prefill, self._last_step[3])
        result = StepResult()
        for token in tokens:
            self._advance(token, result)
        self._read_prompts({t.uid for t in tokens if t.finish_reason is None})
        self._fast_forward(tokens, result)
        self._progress(result, {token.uid for token in tokens})
        self.writer.put_many(result.texts)
        for f in result.finished:
            self._end(f.run, f.reason, in_engine=f.in_engine, kv=f.kv)
        self._end_overdue()
        self._release_deferred()
        if timeline.steps is not None:
            timeline.steps[-1][2] = time.time()

    def _record_step(self, began: float, tokens: list[Token]) -> None:
        """For a benchmark (worker/timeline.py): the step's times and size, and the jobs whose first token it made."""
        assert timeline.steps is not None and self.engine is not None
        done = time.time()
        timeline.steps.append([began, done, done, len(tokens), self.engine.padded_prefill])
        for t in tokens:
            if (r := self.batch.by_uid.get(t.uid)) is not None:
                timeline.mark(r.job.id, "first_token", done)

    def _timed_step(self, now: float) -> None:
        """The step before this one, timed as the loop lives it: from its start to this one's (its output, the
        jobs that joined or left between the two). A step after a pause (nothing ran) starts the clock afresh."""
        model, n, prefill, started = self._last_step
        if model == self.active and 0 < now - started < PAUSE_S:
            self.pace.observe(model, n, prefill, now - started)
        self._last_step = (self.active, 0, 0, now)

    def _advance(self, token: Token, result: StepResult) -> None:
        """One job's token: its text (up to a stop string, if one is hit), and whether it ended."""
        r = self.batch.by_uid.get(token.uid)
        if r is None:  # dropped meanwhile
            return
        r.tokens += 1
        r.ids.append(token.token)
        r.proven = True
        if r.constraint is not None and r.constraint.error:  # (never, unless its mask was not applied)
            logger.error("job %s: its answer left its grammar: %s", r.job.id, r.constraint.error)
            self._end(r, None, error=_generation_error(r.job.id))
            return
        # its grammar complete: nothing may follow (the engine already drew the end; it is not waited for)
        ends = "stop" if r.constraint is not None and r.constraint.done else token.finish_reason
        if token.finish_reason != "stop":  # the EOS token itself is not text
            r.detokenizer.add_token(token.token)
        if ends:
            r.detokenizer.finalize()
        text, hit = r.stops.feed(r.detokenizer.last_segment)
        if ends and not hit:
            text += r.stops.flush()
        result.texts.append(r.text(text, (token.token,), logprobs=(token.logprob,) if token.logprob else ()))
        if hit or ends:  # a stop string or a complete grammar: the engine may not have ended the sequence
            in_engine = token.finish_reason is None
            result.finished.append(Finished(r, "stop" if hit else ends, in_engine=in_engine, kv=token.kv))

    def _fast_forward(self, tokens: list[Token], result: StepResult) -> None:
        """An answer whose grammar now forces several tokens (a schema's fixed keys and punctuation) takes them at
        once: they are its output as if drawn, and it goes on with them read as prompt, in one prefill chunk
        rather than a step each. (Its sampler's key moves past them, as past any token: a resumed run agrees.)"""
        least = self.store.settings.fast_forward
        if not least:
            return
        ending = {f.run.uid for f in result.finished}
        for token in tokens:
            r = self.batch.by_uid.get(token.uid)
            if r is None or r.constraint is None or token.uid in ending:
                continue
            forced = r.constraint.forced(r.job.spec.params.max_tokens - r.tokens)
            if len(forced) < least:
                continue
            kv = self.engine.remove([r.uid], keep=True)[r.uid]  # type: ignore[union-attr]
            before, limit = len(result.finished), r.job.spec.params.max_tokens
            for t in forced:  # one by one: the grammar is complete (done) at the last of them, not before
                r.constraint.take([t])
                entry = self._forced_entry(r, t)
                self._advance(Token(r.uid, t, "length" if r.tokens + 1 == limit else None, logprob=entry), result)
                if len(result.finished) > before:  # it ended on them (its grammar, a stop string, max_tokens)
                    break
            else:
                self._rejoin(r, kv, tuple(forced))

    def _forced_entry(self, r: Running, token: int) -> str | None:
        """A forced token's log probability's entry: under its grammar's mask it was the only token allowed (0)."""
        params = r.job.spec.params
        if not params.logprobs:
            return None
        raw = self.engine.token_bytes[token]  # type: ignore[union-attr]
        return TokenLogprob(raw, 0.0, ((raw, 0.0),) if params.top_logprobs else ()).encode()

    def _rejoin(self, r: Running, kv: KV, forced: tuple[int, ...]) -> None:
        """A fast-forwarded run joins the batch again under a new uid, its KV state and forced tokens as prompt."""
        assert self.engine is not None
        prompt, generated = kv.tokens[: r.prompt_tokens], tuple(kv.tokens[r.prompt_tokens :])
        self.batch.drop(r)
        r.uid = self.engine.insert(
            prompt, _sampling(r.job), kv.cache, len(kv.tokens), generated=generated + forced, constraint=r.constraint
        )
        self.batch.add(r)

    def _progress(self, result: StepResult, advanced: set[int]) -> None:
        """The jobs that made no token in this step (their prompts are being read, a chunk a step) tell that they
        progress, now and then: a long prefill is not a stall."""
        now, every_s = time.monotonic(), min(PROGRESS_S, self.store.settings.stall_s / 4)
        for r in self.batch.by_uid.values():
            if r.uid in advanced:
                r.progressed_at = now
            elif now - r.progressed_at >= every_s:
                r.progressed_at = now
                result.texts.append(r.text(""))

    def _end_overdue(self) -> None:
        """End the jobs past their time limit."""
        now, limit_s = time.monotonic(), self.store.settings.job_time_limit_s
        for r in [r for r in self.batch.by_uid.values() if now > r.deadline]:
            self._flush(r)
            self._end(r, None, error=("time_limit", f"generation ran past the time limit of {limit_s:g} s"))

    def _drop_stopped(self) -> None:
        while not self._stops.empty():  # this loop is the only reader
            r = self._stops.get_nowait()
            if self.batch.by_uid.get(r.uid) is r:  # still this run
                self._flush(r)
                self._end(r, "cancelled")

    def _flush(self, r: Running) -> None:
        """A job cut short keeps the text its detokenizer and stop matcher still held back."""
        r.detokenizer.finalize()
        text, hit = r.stops.feed(r.detokenizer.last_segment)
        text += "" if hit else r.stops.flush()
        if text:
            self.writer.put_many([r.text(text)])

    # --- leaving -------------------------------------------------------------------------------------------

    def _end(
        self,
        r: Running,
        reason: str | None,
        error: tuple[str, ...] | None = None,
        in_engine: bool = True,
        kv: KV | None = None,
    ) -> None:
        """Take a job out of the batch (and out of the engine, if it is still there) and record its outcome. A job
        that ended as its generation meant to leaves its KV state to the prefix cache; one cut short, none."""
        assert self.engine is not None
        status = JobStatus.FAILED if error else JobStatus.CANCELLED if reason == "cancelled" else JobStatus.COMPLETED
        if in_engine:
            kv = self.engine.remove([r.uid], keep=status is JobStatus.COMPLETED).get(r.uid)
        kept = (
            kv is not None
            and status is JobStatus.COMPLETED
            and self.models.prefix.insert(r.cache_key, kv.tokens, kv.cache)
        )
        self.batch.drop(r)
        self.scoring.pop(r.job.id, None)
        self._deferred = [g for g in ([d for d in g if d is not r] for g in self._deferred) if g]
        self._look = True
        for held in self.groups.leave(r):  # it read its group's prompt, and left before it was read
            self.batch.drop(held.run)
            self._place(held.run, held.prompt, held.params, Hit(None, 0), ())
        self.writer.end(
            Ending(
                job_id=r.job.id,
                status=status,
                finish_reason=reason,
                error=error,
                prompt_tokens=r.prompt_tokens,
                completion_tokens=r.tokens,
                stop_seen_at=r.stop_seen_at,
                cached_tokens=r.cached,
                history=r.history() if kept else "",
                stop_sequence=(r.stops.matched or "") if status is JobStatus.COMPLETED else "",
            )
        )
        logger.info("job %s: %s (%s, %d tokens)", r.job.id, status.value, reason or error and error[0], r.tokens)

    def _hand_back_all(self, why: str) -> None:
        shared = len(self.batch) > 1
        for r in list(self.batch.by_uid.values()):
            logger.info("job %s: handed back (%s) after %d tokens", r.job.id, why, r.tokens)
            self.writer.hand_back(r.job.id, why, shared=shared)
        for job_id in list(self.side.runs):
            self.side.drop(job_id)
            logger.info("job %s: handed back (%s), pooled", job_id, why)
            self.writer.hand_back(job_id, why)
        self._start_afresh()

    def _step_failed(self) -> None:
        """A step raised: the engine starts afresh (its state cannot be trusted), and the cause is looked for among
        the step's runs: those that made no token since they joined it (a newcomer's prompt, its first step), else
        all of them. One suspect is the cause (_blame). Several: the first half joins again, the rest wait out of
        the engine until that half has made a token (_release_deferred), and a next failure narrows it down. Every
        other run joins again in its place (_reseat): no attempt counted, no text lost. A run in too many failed
        steps is blamed too, so that no failure repeats without end."""
        assert self.engine is not None
        members = [r for r in self.batch.by_uid.values() if r.uid >= 0]  # the step's (held runs had no part in it)
        if not members:  # nothing of a job failed: the device did
            self._hand_back_all("generation_error")
            return
        for r in members:
            r.failed_steps += 1
        suspects = [r for r in members if not r.proven] or members
        limit = 2 + 2 * self.engine.max_batch.bit_length()  # (halving a full batch takes log2 of it failed steps)
        blamed = {r.job.id for r in members if r.failed_steps >= limit}
        if len(suspects) == 1:
            blamed.add(suspects[0].job.id)
        self.engine.reset()
        self.groups.clear()  # (their held runs join again on their own)
        for r in members:
            if r.job.id in blamed:
                self._blame(r, alone=len(members) == 1)
        suspects = [r for r in suspects if r.job.id not in blamed]
        if len(suspects) > 1:
            later = suspects[len(suspects) // 2 :]
            for r in later:  # in the batch (its slot, its time limit, its cancel), not in the engine
                self.batch.drop(r)
                r.uid = self.batch.hold_uid()
                self.batch.add(r)
            self._deferred.append(later)
        for r in suspects:
            r.proven = False
        out = {r.job.id for group in self._deferred for r in group} | set(self.scoring)
        for r in [r for r in self.batch.by_uid.values() if r.job.id not in out]:
            self._reseat(r)
        self._look = True

    def _blame(self, r: Running, alone: bool) -> None:
        """A failed step's cause: alone in the step it fails (the error was its own); else it goes back to the front
        of the queue to run alone next, where a failure is its own (release() in tasks/lua/common.lua)."""
        if alone:
            self._end(r, None, error=_generation_error(r.job.id), in_engine=False)
            return
        logger.info("job %s: handed back (generation_error: it broke a step) after %d tokens", r.job.id, r.tokens)
        self.batch.drop(r)
        self.writer.hand_back(r.job.id, "generation_error", shared=True)

    def _reseat(self, r: Running) -> None:
        """A run whose KV state went with a failed step joins the engine again, its prompt and the tokens it
        generated read anew (as a requeued run's would be), without leaving the batch: its text, its attempt and its
        place stay."""
        done, cached = tuple(r.ids), r.cached
        try:
            constraint = self._constraint(r.job, done)
        except GrammarError:  # (never: its tokens followed the grammar)
            logger.exception("job %s: its tokens no longer follow its grammar", r.job.id)
            self._end(r, None, error=_generation_error(r.job.id), in_engine=False)
            return
        self.batch.drop(r)
        r.constraint = constraint
        self._place(r, r.prompt, _sampling(r.job), self.models.prefix.fetch(r.cache_key, [*r.prompt, *done]), done)
        r.cached = cached  # (its usage tells what the prefix cache spared it when it joined first)

    def _release_deferred(self) -> None:
        """Once every run in the engine has made a token since a failed step, the suspects that joined again did not
        cause it: those kept out last join (the cause is among them, if it was among the suspects at all)."""
        if not self._deferred or not all(r.proven for r in self.batch.by_uid.values() if r.uid >= 0):
            return
        for r in self._deferred.pop():
            if self.batch.by_job.get(r.job.id) is r:  # (not ended meanwhile)
                self._reseat(r)
        self._look = True  # (none joined while they were kept out)

    def _start_afresh(self) -> None:
        """An empty batch, and an engine with nothing in it."""
        assert self.engine is not None
        self.engine.reset()
        self.batch = Batch()
        self.groups.clear()
        self.scoring.clear()
        self._deferred.clear()
        self._look = True


def _sampling(job: Job) -> SamplingParams:
    """How every run of a job samples: a sampled job without a seed draws from a seed of its own, taken from its id,
        so that a run after a requeue writes what the run before it wrote (an OpenAI stream goes on where it was). A job
    whose answer follows a grammar ends where the grammar does, ignore_eos or not."""
    params = job.spec.params
    if job.spec.constraint is not None and params.ignore_eos:  # a complete grammar ends the answer, as EOS does
        params = params.model_copy(update={"ignore_eos": False})
    if params.seed is not None or params.temperature == 0:
        return params
    seed = int.from_bytes(hashlib.blake2b(job.id.encode(), digest_size=4).digest(), "big")
    return params.model_copy(update={"seed": seed})


def _generation_error(job_id: str) -> tuple[str, str]:
    return "generation_error", f"generation failed; the worker logged the error for job {job_id}"
