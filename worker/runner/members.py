"""The batch's members and the model they run on (`Members`): the one object the loop's parts are given, and the
only one that puts a run into the batch or takes it out, so it alone can tell when room was made.

A run is in the batch from the moment it joins until it leaves for good; meanwhile it may be in the engine (a
sequence of the model's batch) or held beside it under a negative uid: reading its prompt to score it, waiting
for another answer of its request to read their common prompt (worker/runner/choices.py), or kept out after a failed
step (worker/runner/leaving.py)."""

from __future__ import annotations

import logging

from tasks.errors import InvalidPrompt
from tasks.job import Job, JobStatus, SamplingParams
from tasks.store import WorkerStore
from worker import timeline
from worker.batch.engine import KV, Engine
from worker.batch.sampling import Scorer, sampling
from worker.grammar import GrammarMatcher
from worker.models import ModelPool
from worker.output import OutputWriter
from worker.output_records import Ending
from worker.prefix_cache import Hit
from worker.runner.choices import Groups, Held
from worker.runner.runs import Roster, Running

logger = logging.getLogger(__name__)


class Members:
    """The runs in the batch (`batch`), the model they run on (`active`, its `engine`), the answers of one request
    reading their prompt once (`groups`), the runs reading their prompt to score it (`scoring`); and `freed`, how
    many times room was made in it (a run left, a placement failed, the engine started afresh): the loop looks at
    the queue again when it moved."""

    def __init__(self, store: WorkerStore, models: ModelPool, writer: OutputWriter) -> None:
        self.store = store
        self.models = models
        self.writer = writer
        self.engine: Engine | None = None  # the active model's: the one the batch runs
        self.active = ""
        self.batch = Roster()
        self.groups = Groups()  # the requests of several answers with a run in the batch (worker/runner/choices.py)
        self.scoring: dict[str, tuple[Running, Scorer, SamplingParams]] = {}  # runs reading their prompt to score it
        self.freed = 0

    def activate(self, model: str) -> None:
        """The batch's model is its first job's."""
        if model != self.active:
            logger.info("batch switches to model %s (from %s)", model, self.active or "none")
            self.store.upkeep.count("model_switches")
        self.active, self.engine = model, self.models.get(model)

    def constraint(self, job: Job, done: tuple[int, ...]) -> GrammarMatcher | None:
        """The job's grammar's matcher (None: its answer is free), past the tokens its earlier runs generated."""
        if job.spec.constraint is None:
            return None
        assert self.engine is not None
        return self.engine.grammars.constrain(job.spec.constraint.grammar, done)

    def fetch(self, run: Running, done: tuple[int, ...]) -> Hit:
        """What the prefix cache holds of a run's prompt (and the tokens its earlier runs generated)."""
        assert self.engine is not None
        tokens = [*run.prompt, *done]
        return self.models.prefix.fetch(run.cache_key, tokens, self.engine.marks(tokens))

    def score(self, run: Running, scorer: Scorer, params: SamplingParams) -> None:
        """A new run reads its prompt to score it (echo): in the batch, not in the engine, while it is read."""
        self.scoring[run.job.id] = (run, scorer, params)
        self.hold(run)

    def hold(self, run: Running) -> None:
        """A run in the batch (its slot, its time limit, its cancel), not in the engine."""
        if self.batch.by_job.get(run.job.id) is run:
            self.batch.drop(run)
        run.uid = self.batch.hold_uid()
        self.batch.add(run)

    def place(self, run: Running, prompt: list[int], params: SamplingParams, hit: Hit, done: tuple[int, ...]) -> bool:
        """Put a run (anew, if it is in the batch already) into the engine, from what of its prompt is read already
        (`hit`), or hold it until another answer of its request has read their common prompt (worker/runner/choices.py).
        False if its prompt cannot be read (its images' embeddings could not be made: it failed, and left)."""
        assert self.engine is not None
        if self.batch.by_job.get(run.job.id) is run:
            self.batch.drop(run)
        choice = run.job.spec.choice if not done else None  # (a run after a requeue goes on from its own tokens)
        group = self.groups.get(choice.group) if choice else None
        if group is not None and group.prompt == prompt and hit.tokens < len(prompt) - 1:
            if group.leader is not None:  # being read: wait for it
                self.groups.hold(group, Held(run, prompt, params))
                self.hold(run)
                return True
            if group.cache is not None:
                hit = Hit(group.copy(), len(prompt) - 1)
        try:
            run.uid = self.engine.insert(
                prompt, params, hit.cache, hit.tokens, generated=done, constraint=run.constraint
            )
        except InvalidPrompt as exc:  # (worker/vision.py: the images of its prompt are no longer held)
            self.writer.end(Ending(job_id=run.job.id, status=JobStatus.FAILED, error=(exc.type, exc.message)))
            self.freed += 1
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

    def reinsert(self, run: Running, kv: KV, forced: tuple[int, ...]) -> None:
        """A run taken out of the engine with its KV state goes back in under a new uid, `forced` tokens read as
        prompt after what it generated (worker/runner/stepping.py's fast-forward)."""
        assert self.engine is not None
        prompt, generated = kv.tokens[: run.prompt_tokens], tuple(kv.tokens[run.prompt_tokens :])
        self.batch.drop(run)
        run.uid = self.engine.insert(
            prompt, sampling(run.job), kv.cache, len(kv.tokens), generated=generated + forced, constraint=run.constraint
        )
        self.batch.add(run)

    def read_prompts(self, uids: set[int]) -> None:
        """The groups whose leader made its first token in this step: their held runs join, their prompt read."""
        assert self.engine is not None
        for group in self.groups.read(uids):
            leader = group.leader
            assert leader is not None
            for held in self.groups.release(group, self.engine.extract(leader.uid, len(group.prompt) - 1)):
                cached = len(group.prompt) - 1 if group.cache is not None else 0
                self.place(held.run, held.prompt, held.params, Hit(group.copy(), cached), ())

    def leave(self, run: Running) -> None:
        """A run leaves the batch for good (its engine sequence, if any, taken out by the caller): a leader of its
        request's answers that leaves before its prompt is read lets its held runs read it on their own."""
        self.batch.drop(run)
        self.scoring.pop(run.job.id, None)
        self.freed += 1
        for held in self.groups.leave(run):  # it read its group's prompt, and left before it was read
            self.place(held.run, held.prompt, held.params, Hit(None, 0), ())

    def restart(self) -> None:
        """The engine starts afresh (its state cannot be trusted), the runs staying in the batch to join it again."""
        assert self.engine is not None
        self.engine.reset()
        self.groups.clear()  # (their held runs join again on their own)
        self.freed += 1

    def clear(self) -> None:
        """An empty batch, and an engine with nothing in it."""
        assert self.engine is not None
        self.engine.reset()
        self.batch = Roster()
        self.groups.clear()
        self.scoring.clear()
        self.freed += 1
