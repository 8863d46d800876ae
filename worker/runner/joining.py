"""A claimed job joins the batch: checked against what its model can do, and placed in the engine, from what of
its prompt is read already (the prefix cache, or another answer of its request), or from what its earlier runs
generated (worker/resume.py)."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from tasks.job import Job, JobStatus, SamplingParams
from tasks.store import Claim, WorkerStore
from worker.batch.logits import vocabulary
from worker.batch.sampling import sampling
from worker.grammar import GrammarError
from worker.output import OutputWriter
from worker.output_records import Ending, Text
from worker.resume import Resumption, fresh, resume
from worker.runner.members import Members
from worker.runner.runs import Head, Running

logger = logging.getLogger(__name__)


class Joining:
    """How a started job comes into the batch: its run made, its prompt scored or placed in the engine, the batch
    switched to its model if it is the first."""

    def __init__(self, store: WorkerStore, members: Members, writer: OutputWriter) -> None:
        self.store = store
        self.members = members
        self.writer = writer

    def join(self, claim: Claim, head: Head) -> None:
        """A started job joins the batch, as measured (`head`: worker/runner/claiming.py), or fails at once if it
        cannot be generated from."""
        job = claim.job
        if head.invalid is None and not job.spec.side and head.max_tokens < job.spec.params.max_tokens:
            claim = replace(claim, job=_clipped(job, head.max_tokens))  # its answer ends where the context does
            job = claim.job
        if not self.members.batch and head.invalid is None:
            self.members.activate(job.spec.model)
        logger.info(
            "job %s: started (owner %s, model %s, attempt %d, batch %d)",
            job.id,
            job.owner,
            job.spec.model,
            job.attempts,
            len(self.members.batch) + 1,
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
        job, engine = claim.job, self.members.engine
        assert engine is not None
        done = claim.delivered.ids if claim.delivered else ()
        try:
            constraint = self.members.constraint(job, done)
        except GrammarError as exc:  # admission checked it without the tokenizer; this tokenizer cannot
            self.writer.end(Ending(job_id=job.id, status=JobStatus.FAILED, error=("invalid_schema", str(exc)[:500])))
            return None
        complete = constraint is not None and constraint.done  # its earlier run completed the grammar
        start = (
            resume(engine.detokenizer(), params, claim.delivered, engine.eos, complete)
            if claim.delivered
            else fresh(engine.detokenizer(), params)
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
        engine = self.members.engine
        assert engine is not None
        job, done = run.job, tuple(run.ids)
        if params.prompt_logprobs and not job.prompt_logprobs:  # (a run after a requeue has them already)
            self.members.score(run, engine.scorer(prompt, params.top_logprobs), params)
            return True
        if params.max_tokens == 0:  # its earlier run scored its prompt; only its ending was lost
            ending = Ending(
                job_id=job.id, status=JobStatus.COMPLETED, finish_reason="length", prompt_tokens=len(prompt)
            )
            self.writer.end(ending)
            return False
        return self.members.place(run, prompt, params, self.members.fetch(run, done), done)

    def _unfit(self, job: Job) -> tuple[str, ...] | None:
        """Why the job's request cannot be generated from on this model, though it passed admission."""
        bias, e = job.spec.params.logit_bias, self.members.engine
        vocab = vocabulary(e.tokenizer, e.vocab) if bias and e is not None else 0
        beyond = sorted(t for t in bias if t >= vocab)
        if beyond:
            why = f"logit_bias names token {beyond[0]}; the model's vocabulary has {vocab} tokens"
            return "invalid_request", why, "logit_bias"
        return None


def _clipped(job: Job, max_tokens: int) -> Job:
    """`job` as it runs, its answer at most `max_tokens` (what its prompt leaves of the context)."""
    params = job.spec.params.model_copy(update={"max_tokens": max_tokens})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"params": params})})
