"""A claimed job joins the batch: measured (its prompt's tokens, its KV cost), checked against what this model can
do, and placed in the engine, from what of its prompt is read already (the prefix cache, or another answer of
its request), or from what its earlier runs generated (worker/resume.py)."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from tasks.context import Window
from tasks.errors import ContextLengthExceeded, InvalidPrompt
from tasks.job import Job, JobStatus, SamplingParams
from tasks.model_kind import NAMES
from tasks.scheduling import fits
from tasks.store import Claim
from worker import timeline
from worker.batch.engine import Engine
from worker.batch.runs import Head, Running
from worker.batch.sampling import sampling
from worker.batch.state import RunnerState, generation_error
from worker.choices import Held
from worker.grammar import GrammarError, GrammarMatcher
from worker.logits import vocabulary
from worker.output_records import Ending, Text
from worker.pooling import Pooler
from worker.prefix_cache import Hit
from worker.resume import Resumption, fresh, resume
from worker.vision_prep import Preparing

logger = logging.getLogger(__name__)


class Joining(RunnerState):
    """How a job comes into the batch, and the model the batch runs."""

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
                wait=wait or not self.batch,  # (an empty batch has nothing to step meanwhile)
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

    def _fits(self, head: Head) -> bool:
        """A job joins if the budget holds it, or if the batch is empty (a job too big for the budget runs alone);
        one that must run alone waits for the batch to drain."""
        if head.preparing:
            return False
        if not self.batch or head.side:
            return True
        assert self.engine is not None  # (a batch with jobs in it has its model's engine)
        room = len(self.batch) < self.engine.max_batch and not self.batch.solo
        return room and not head.solo and fits(head.cost, self.batch.costs(), self.budget)

    def _join(self, claim: Claim) -> None:
        """A started job joins the batch (measured as the head, or now: claimed into an empty batch), or fails at
        once if it cannot be generated from."""
        job, head = claim.job, self._head
        self._head = None
        if head is None or head.id != job.id or head.preparing:
            head = self._measure(claim, wait=True)
        if head.invalid is None and not job.spec.side and head.max_tokens < job.spec.params.max_tokens:
            claim = replace(claim, job=_clipped(job, head.max_tokens))  # its answer ends where the context does
            job = claim.job
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
        self.writer.begin(job.id, live=claim.live)
        params = sampling(job)
        begun = self._run_of(claim, head, params)
        if begun is None:
            return
        run, start = begun
        if self._enter(run, head.tokens, params):
            if run.cached:
                logger.info("job %s: %d of its %d prompt tokens read before", job.id, run.cached, len(head.tokens))
            # its prompt and what of it is cached, recorded at once: estimates count only the prefill still to do
            self.writer.put_many([run.text(start.rest, resume_at=start.at)])

    def _run_of(self, claim: Claim, head: Head, params: SamplingParams) -> tuple[Running, Resumption] | None:
        """A job's run and how it starts, from its start or from the tokens its earlier runs generated; None if it ends at once (its
        grammar cannot be read by this tokenizer, or its earlier run generated it whole and only its ending was
        lost)."""
        assert self.engine is not None
        job = claim.job
        done = claim.delivered.ids if claim.delivered else ()
        try:
            constraint = self._constraint(job, done)
        except GrammarError as exc:  # admission checked it without the tokenizer; this tokenizer cannot
            self.writer.end(Ending(job_id=job.id, status=JobStatus.FAILED, error=("invalid_schema", str(exc)[:500])))
            return None
        complete = constraint is not None and constraint.done  # its earlier run completed the grammar
        start = (
            resume(self.engine.detokenizer(), params, claim.delivered, self.engine.eos, complete)
            if claim.delivered
            else fresh(self.engine.detokenizer(), params)
        )
        if done:
            logger.info("job %s: goes on from the %d tokens its earlier runs generated", job.id, len(done))
        if start.ended:  # its earlier run generated it whole: only its ending was lost
            text = Text(job_id=job.id, text=start.rest, prompt_tokens=len(head.tokens), resume_at=start.at)
            self.writer.put_many([text])
            ending = Ending(
                job_id=job.id,
                status=JobStatus.COMPLETED,
                finish_reason=start.ended,
                prompt_tokens=len(head.tokens),
                completion_tokens=len(done),
            )
            self.writer.end(ending)
            return None
        run = Running(
            job=job,
            uid=0,
            prompt_tokens=len(head.tokens),
            cost=head.cost,
            deadline=time.monotonic() + self.store.settings.job_time_limit_s,
            detokenizer=start.detokenizer,
            stops=start.stops,
            solo=head.solo,
            tokens=len(done),
            cache_key=self.store.settings.prefix_key(job.spec.model, job.owner),
            constraint=constraint,
            answer=[claim.delivered.text] if claim.delivered else [],
            prompt=head.tokens,
            ids=list(done),
        )
        return run, start

    def _enter(self, run: Running, prompt: list[int], params: SamplingParams) -> bool:
        """A new run into the batch: to read its prompt first if it scores it (echo), else into the engine. False
        if it ended instead (its earlier run scored its prompt and only its ending was lost, or it cannot be
        placed)."""
        assert self.engine is not None
        job, done = run.job, tuple(run.ids)
        if params.prompt_logprobs and not job.prompt_logprobs:  # (a run after a requeue has them already)
            self.scoring[job.id] = (run, self.engine.scorer(prompt, params.top_logprobs), params)
            run.uid = self.batch.hold_uid()  # in the batch, not in the engine, while it is read
            self.batch.add(run)
            return True
        if params.max_tokens == 0:  # its earlier run scored its prompt; only its ending was lost
            ending = Ending(
                job_id=job.id, status=JobStatus.COMPLETED, finish_reason="length", prompt_tokens=len(prompt)
            )
            self.writer.end(ending)
            return False
        return self._place(run, prompt, params, self._fetch(run, done), done)

    def _fetch(self, run: Running, done: tuple[int, ...]) -> Hit:
        """What the prefix cache holds of a run's prompt (and the tokens its earlier runs generated)."""
        assert self.engine is not None
        tokens = [*run.prompt, *done]
        return self.models.prefix.fetch(run.cache_key, tokens, self.engine.marks(tokens))

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

    def _constraint(self, job: Job, done: tuple[int, ...]) -> GrammarMatcher | None:
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


def _clipped(job: Job, max_tokens: int) -> Job:
    """`job` as it runs, its answer at most `max_tokens` (what its prompt leaves of the context)."""
    params = job.spec.params.model_copy(update={"max_tokens": max_tokens})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"params": params})})
