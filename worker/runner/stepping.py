"""One step of the batch on the device, and what it brought: each job's token turned into text (up to a stop
string), the jobs that ended, the answers whose grammar forces several tokens at once, and the prompts scored."""

from __future__ import annotations

import logging
import time

from tasks.logprobs import TokenLogprob
from tasks.settings import PREFILL_BATCH, Settings
from worker import timeline
from worker.batch.engine import Token
from worker.output import OutputWriter
from worker.pace import Pace
from worker.prefix_cache import Hit
from worker.runner.leaving import Leaving
from worker.runner.members import Members
from worker.runner.runs import Finished, Running, StepResult, generation_error
from worker.step_watch import StepWatch

logger = logging.getLogger(__name__)

PROGRESS_S = 1.0  # how often a job that makes no token (its prompt is read) tells it progresses (at most)
PAUSE_S = 5.0  # a gap this long between two steps is a pause (the batch was empty), not a slow step
NO_STEP = ("", 0, 0, 0.0, 0)  # no step before: its model, sequences, prompt tokens, when it started, tokens


class Stepping:
    """The batch's step, and its tokens' way to text and endings (recorded by `leaving`). It times each step as the
    loop lives it, for the model's pace (`pace`, which the heartbeat reports with `watch`)."""

    def __init__(
        self,
        settings: Settings,
        members: Members,
        leaving: Leaving,
        writer: OutputWriter,
        pace: Pace,
        watch: StepWatch,
    ) -> None:
        self.settings = settings
        self.members = members
        self.leaving = leaving
        self.writer = writer
        self.pace = pace
        self.watch = watch
        self._last_step = NO_STEP  # the step before: its model, sequences, prompt tokens, when it started, tokens

    def pause(self) -> None:
        """What comes next is no part of a step before: pooled work read between two steps, or no work at all (the
        next step's clock starts with it)."""
        self._last_step = NO_STEP

    def step(self) -> bool:
        """One step of the batch: every job's new text in one hand-over, then the endings of the jobs that ended
        (after their last text), then those over their time limit. A step that raised has its cause looked for
        (Leaving.step_failed); False if no run was in it: the device failed (the caller hands every job back)."""
        engine, batch = self.members.engine, self.members.batch
        assert engine is not None
        self._timed_step(time.perf_counter())
        began = timeline.clock()
        self._score()
        n = len(batch)
        self.watch.start(self.pace.speed(self.members.active), n, engine.prefill_step * min(n, PREFILL_BATCH))
        try:
            tokens = engine.step()
        except Exception:  # the batch's state cannot be trusted: start it afresh, and find the cause
            logger.exception("a batch step failed with %d job(s) in the batch", len(batch))
            return self.leaving.step_failed()
        finally:
            self.watch.stop()
        timeline.stepped(began, len(tokens), engine.padded_prefill, lambda: self._job_ids(tokens))
        # (its sequences, and its tokens: a sequence's step brings several where it kept proposals)
        sequences = len({t.uid for t in tokens})
        self._last_step = (self.members.active, sequences, engine.padded_prefill, self._last_step[3], len(tokens))
        result = self._read(tokens)
        self.writer.put_many(result.texts)
        for f in result.finished:
            self.leaving.end(f.run, f.reason, in_engine=f.in_engine, kv=f.kv)
        self.leaving.end_overdue()
        self.leaving.release_deferred()
        timeline.step_ended()
        return True

    def _read(self, tokens: list[Token]) -> StepResult:
        """What a step's tokens bring: each job's text, and the jobs that ended (a step may bring a sequence several
        tokens: none is read past its end); the prompts of several answers read, forced tokens taken, progress."""
        result = StepResult()
        ended: set[int] = set()
        last = {token.uid: n for n, token in enumerate(tokens)}
        for n, token in enumerate(tokens):
            if token.uid in ended:
                continue
            before = len(result.finished)
            self._advance(token, result, final=last[token.uid] == n)
            if len(result.finished) > before:
                ended.add(token.uid)
        self.members.read_prompts({t.uid for t in tokens if t.finish_reason is None})
        self._fast_forward(tokens, result)
        self._progress(result, {token.uid for token in tokens})
        return result

    def _job_ids(self, tokens: list[Token]) -> list[str]:
        """The jobs of a step's tokens (for a benchmark's timeline: worker/timeline.py)."""
        return [r.job.id for t in tokens if (r := self.members.batch.by_uid.get(t.uid)) is not None]

    def _timed_step(self, now: float) -> None:
        """The step before this one, timed as the loop lives it: from its start to this one's (its output, the
        jobs that joined or left between the two). A step after a pause (nothing ran) starts the clock afresh."""
        model, n, prefill, started, tokens = self._last_step
        if model == self.members.active and 0 < now - started < PAUSE_S:
            self.pace.observe(model, n, prefill, now - started, tokens)
        self._last_step = (self.members.active, 0, 0, now, 0)

    def _advance(self, token: Token, result: StepResult, final: bool = True) -> None:
        """One job's token: its text (up to a stop string, if one is hit), and whether it ended. (`final`: its last
        token of the step: its grammar, taken up to the step's last token, is complete only there.)"""
        r = self.members.batch.by_uid.get(token.uid)
        if r is None:  # dropped meanwhile
            return
        r.tokens += 1
        r.proposed += token.proposed
        r.accepted += token.accepted
        r.ids.append(token.token)
        r.proven = True
        if r.constraint is not None and r.constraint.error:  # (never, unless its mask was not applied)
            logger.error("job %s: its answer left its grammar: %s", r.job.id, r.constraint.error)
            self.leaving.end(r, None, error=generation_error(r.job.id))
            return
        # its grammar complete: nothing may follow (the engine already drew the end; it is not waited for)
        ends = "stop" if final and r.constraint is not None and r.constraint.done else token.finish_reason
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
            reason = "stop" if hit or ends is None else ends
            result.finished.append(Finished(r, reason, in_engine=in_engine, kv=token.kv))

    def _fast_forward(self, tokens: list[Token], result: StepResult) -> None:
        """An answer whose grammar now forces several tokens (a schema's fixed keys and punctuation) takes them at
        once: they are its output as if drawn, and it goes on with them read as prompt, in one prefill chunk
        rather than a step each. (Its sampler's key moves past them, as past any token: a resumed run agrees.)"""
        least = self.settings.fast_forward
        if not least:
            return
        ending = {f.run.uid for f in result.finished}
        for token in tokens:
            r = self.members.batch.by_uid.get(token.uid)
            if r is None or r.constraint is None or token.uid in ending:
                continue
            forced = r.constraint.forced(r.job.spec.params.max_tokens - r.tokens)
            if len(forced) < least:
                continue
            assert self.members.engine is not None
            kv = self.members.engine.remove([r.uid], keep=True)[r.uid]
            before, limit = len(result.finished), r.job.spec.params.max_tokens
            for t in forced:  # one by one: the grammar is complete (done) at the last of them, not before
                r.constraint.take([t])
                entry = self._forced_entry(r, t)
                last = "length" if r.tokens + 1 == limit else None
                self._advance(Token(uid=r.uid, token=t, finish_reason=last, logprob=entry), result)
                if len(result.finished) > before:  # it ended on them (its grammar, a stop string, max_tokens)
                    break
            else:
                self.members.reinsert(r, kv, tuple(forced))

    def _forced_entry(self, r: Running, token: int) -> str | None:
        """A forced token's log probability's entry: under its grammar's mask it was the only token allowed (0)."""
        params = r.job.spec.params
        if not params.logprobs:
            return None
        assert self.members.engine is not None
        raw = self.members.engine.token_bytes[token]
        return TokenLogprob(raw, 0.0, ((raw, 0.0),) if params.top_logprobs else ()).encode()

    def _progress(self, result: StepResult, advanced: set[int]) -> None:
        """The jobs that made no token in this step (their prompts are being read, a chunk a step) tell that they
        progress, now and then: a long prefill is not a stall."""
        now, every_s = time.monotonic(), min(PROGRESS_S, self.settings.stall_s / 4)
        for r in self.members.batch.by_uid.values():
            if r.uid in advanced:
                r.progressed_at = now
            elif now - r.progressed_at >= every_s:
                r.progressed_at = now
                result.texts.append(r.text(""))

    def _score(self) -> None:
        """Read a chunk of the prompt of the first job that scores its prompt (echo); once read, its log
        probabilities are written, and it ends (max_tokens 0) or goes on to generate, its prompt's KV state read."""
        scoring = self.members.scoring
        if not scoring:
            return
        job_id, (run, scorer, params) = next(iter(scoring.items()))
        try:
            scorer.advance()
        except Exception:  # read outside the batch, with a KV cache of its own: its failure is its own alone
            logger.exception("job %s: reading its prompt to score it failed", job_id)
            self.leaving.end(run, None, error=generation_error(job_id))
            return
        if not scorer.done:
            return
        del scoring[job_id]
        self.writer.put_many([run.text("", prompt_logprobs=scorer.entries)])
        if params.max_tokens == 0:
            self.leaving.end(run, "length")
            return
        self.members.place(run, scorer.prompt, params, Hit(scorer.cache, len(scorer.prompt) - 1), ())
