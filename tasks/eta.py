"""When each waiting job should start: a forecast from what the device is really doing.

The device's batch is played forward from now, as the worker will run it: every running job has its expected
tokens left, generated one a step (or as many as its sequences got a step, where they keep proposals) at the step
time its batch size gives (measured on the device: worker/pace.py);
a job ends, its slot frees, and the next waiting job in fair order joins, if the KV budget holds it, paying its
prefill (the part of its prompt a prefix cache does not hold); a job of another model waits for the batch to drain
(jobs of the running model may go ahead of it for ONELANE_MODEL_SWITCH_WAIT_S, as claim.lua lets them) and for its
model to load. A job's expected length is what recent answers of its model suggest: answers stop by themselves
before max_tokens more often than not. Interactive work does not wait behind batch work (worker/runner/preemption.py): when a
batch is full and holds a batch-class job set aside fewer than ONELANE_PREEMPT_LIMIT times, the first interactive
job of its model within the first 64 waiting takes its slot between two steps, and the batch-class job goes back to
the front of the line, keeping its tokens.

The snapshot it reads is taken in one Lua call (eta_snapshot in tasks/lua/common.lua); everything here is plain
arithmetic on it, so a forecast costs Redis one round trip whatever the queue's length.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

from tasks.scheduling import LOOK_AHEAD, fits, set_aside
from tasks.settings import PREFILL_BATCH

LIMIT = 1000  # waiting jobs played forward; the start of one further back is extrapolated from theirs
# a pace before any step of the model was measured (a worker times a model's steps as it loads it: so, of a model
# never loaded yet): step s, per sequence, per token
FALLBACK = (0.05, 0.005, 0.0005)
CHARS_PER_TOKEN = 4.0  # before any prompt of the model was measured
LOAD_PRIOR_S = 10.0  # a load going on of a model never loaded before (the default model's first load: 8-14 s here)
LOAD_LEAST_S = 1.0  # a load going on past its last load's time still takes this much more, as far as one knows


@dataclass(frozen=True)
class Speed:
    """A model's pace on a device, in seconds: a step's fixed cost, per generating sequence, per prompt token."""

    step_s: float
    per_sequence_s: float
    per_prompt_token_s: float
    tokens_per_step: float = 1.0  # a sequence's tokens a step: more than one where it keeps proposals (speculation)

    @classmethod
    def parse(cls, raw: Any) -> Speed | None:
        try:
            figures = [float(x) for x in (json.loads(raw) if isinstance(raw, str) else raw)]
        except (TypeError, ValueError):
            return None
        if len(figures) not in (3, 4) or (len(figures) == 4 and figures[3] < 1):
            return None
        return cls(*figures)

    def step(self, sequences: int) -> float:
        return self.step_s + self.per_sequence_s * sequences

    def as_list(self) -> list[float]:
        """As a worker reports it (worker/pace.py), and `parse` reads it back."""
        return [
            round(self.step_s, 6),
            round(self.per_sequence_s, 6),
            round(self.per_prompt_token_s, 7),
            round(self.tokens_per_step, 3),
        ]


@dataclass(frozen=True)
class Lengths:
    """What recent completed answers of one model tell: (completion tokens, max_tokens, how it ended), and how many
    characters a prompt token takes."""

    answers: tuple[tuple[int, int, str], ...] = ()
    chars_per_token: float = CHARS_PER_TOKEN

    @classmethod
    def parse(cls, rows: list[str]) -> Lengths:
        answers, chars, tokens = [], 0, 0
        for row in rows:
            try:
                c, m, how, pc, pt = row.split(",")
                answers.append((int(c), int(m), how))
                chars, tokens = chars + int(pc), tokens + int(pt)
            except ValueError:
                continue
        return cls(tuple(answers), chars / tokens if chars > 0 and tokens > 0 else CHARS_PER_TOKEN)

    def left(self, max_tokens: int, done: int = 0, ignore_eos: bool = False) -> float:
        """The tokens a job with `done` tokens so far should still generate, from the answers that got further than
        `done`: one that ended by itself counts its length (up to max_tokens); one cut at its own limit says only
        that it would have gone on, and counts as max_tokens; and max_tokens itself, as a prior of one answer."""
        if ignore_eos or done >= max_tokens:
            return max(max_tokens - done, 0)
        further = [
            min(c, max_tokens) if how == "s" else max_tokens for c, _, how in self.answers if how != "i" and c > done
        ]
        return max((sum(further) + max_tokens) / (len(further) + 1) - done, 1.0)


@dataclass(frozen=True)
class ModelFacts:
    """What a forecast knows of a model: its pace, its load time, its jobs' lengths, whether they run alone."""

    pace: Speed | None
    load_s: float
    lengths: Lengths
    alone: bool = False  # its jobs run one at a time (worker/batch/sharing.py)
    loading_s: float | None = None  # while a worker loads it: for how long so far

    @property
    def load_left_s(self) -> float:
        """What loading it still takes: its last load's time; while it loads, what is left of that (of LOAD_PRIOR_S
        when it never loaded before), at least LOAD_LEAST_S."""
        if self.loading_s is None:
            return self.load_s
        return max((self.load_s or LOAD_PRIOR_S) - self.loading_s, LOAD_LEAST_S)


@dataclass(frozen=True)
class Waiting:
    id: str
    model: str
    max_tokens: int
    done: int  # tokens an earlier run generated (it was requeued): its next run goes on from them
    ignore_eos: bool
    prompt_chars: int
    cached_chars: int  # of its prompt, what a device's prefix cache probably holds (its history)
    batch: bool = False  # a batch-class job: an interactive one may set it aside when it runs (preemption)
    preemptions: int = 0  # the times it was set aside so far
    interactive: bool = True  # it may take a batch-class job's slot (not a batch, side or solo job)
    prompt_tokens: int = 0  # its prompt in tokens, when known (counted at admission, or a run the forecast set
    # aside); else from prompt_chars
    kept: bool = False  # its prompt and tokens so far are in a prefix cache (a run the forecast set aside)


@dataclass(eq=False)
class _Run:
    left: float  # tokens
    model: str
    kv: int  # the KV tokens it may come to hold: prompt + max_tokens
    job: Waiting  # what it goes back to the queue as, should it be set aside
    prompt: int = 0  # its prompt's tokens
    done: float = 0.0  # the tokens it has generated (in all its runs)

    @property
    def tokens(self) -> float:
        """What setting it aside costs: the KV state it holds, to keep and to read again (worker/runner/preemption.py)."""
        return self.prompt + self.done


@dataclass
class _Device:
    slots: int
    loaded: set[str]
    pace: dict[str, Speed]
    runs: list[_Run] = field(default_factory=list)
    busy_s: float = 0.0  # device time owed before its batch steps on: prefills, a model's load
    seen: dict[str, Speed] = field(default_factory=dict)  # a pace as its running jobs show it, per model
    step_ends: float = 0.0  # when the step going on now ends (forecast time)
    reading: list[int] = field(default_factory=list)  # the prompt tokens its running jobs with no token yet read ...
    reading_s: float = 0.0  # ... and how long the first of them has been at it
    joining: list[int] = field(default_factory=list)  # the prompt tokens of the jobs joining at the forecast's now
    joining_at: float = -1.0

    @property
    def model(self) -> str:
        return self.runs[0].model if self.runs else ""


@dataclass(frozen=True)
class Snapshot:
    """What a forecast starts from (see the module's docstring)."""

    devices: list[dict[str, Any]]
    running: list[dict[str, Any]]
    waiting: list[Waiting]
    models: dict[str, ModelFacts]
    blocked: str = ""  # the waiting job that jobs of a ready model pass over
    blocked_s: float = 0.0  # ... since how long

    @classmethod
    def parse(cls, raw: str) -> Snapshot:
        data = json.loads(raw)
        models = {
            name: ModelFacts(
                Speed.parse(m.get("pace") or ""),
                float(m.get("load_s") or 0),
                Lengths.parse(_list(m, "lengths")),
                m.get("batching") == "alone",
                float(m["loading_s"]) if m.get("loading_s") is not None else None,
            )
            for name, m in (data.get("models") or {}).items()
        }
        waiting = [
            Waiting(
                w["id"],
                w["model"],
                int(w["max_tokens"]),
                int(w["done"]),
                bool(w["ignore_eos"]),
                int(w["prompt_chars"]),
                int(w["cached_chars"]),
                bool(w.get("batch")),
                int(w.get("preemptions") or 0),
                bool(w.get("interactive", not w.get("batch"))),
                int(w.get("prompt_tokens") or 0),
            )
            for w in _list(data, "waiting")
        ]
        devices, running = _list(data, "devices"), _list(data, "running")
        return cls(devices, running, waiting, models, data.get("blocked") or "", float(data.get("blocked_s") or 0))


def _list(data: dict[str, Any], name: str) -> list[Any]:
    """A list of the snapshot's (Lua's cjson writes an empty one as {})."""
    value = data.get(name)
    return value if isinstance(value, list) else []


def padded(prompts: list[int]) -> int:
    """What reading these prompts side by side costs, in tokens: each is padded to the longest."""
    return len(prompts) * max(prompts, default=0)


@dataclass(frozen=True)
class Rules:
    """The settings a forecast plays by: the worker's slots when none reports them, its KV budget, the switch wait,
    the most prompt tokens one step reads (a job joins between two steps), and how many times a batch-class job may
    be set aside for interactive work (ONELANE_PREEMPT_LIMIT; 0: never)."""

    slots: int
    kv_budget: int
    switch_wait_s: float
    step_prefill: int = 128 * PREFILL_BATCH
    preempt_limit: int = 0


@dataclass(frozen=True)
class Plan:
    """A forecast: when each waiting job should start (`starts`, in seconds from now), and in which turn of the
    play it starts (`turns`), both in fair order."""

    starts: list[float]
    turns: list[int]
    in_order: bool = True  # they start in fair order (the common case: each one's position is its rank)

    def eta(self, position: int) -> float:
        return eta_at(self.starts, position)

    def position(self, rank: int) -> int:
        """1 + the jobs that start before the job at `rank` in the fair order (1: its head): its rank, less the jobs
        ahead of it that start after it (it passes them: an interactive job that takes a batch-class job's slot, a
        job of the batch's model that passes a head waiting for its own model). A rank past those played forward
        is itself."""
        if self.in_order or rank > len(self.turns):
            return rank
        turn, start = self.turns[rank - 1], self.starts[rank - 1]
        return rank - sum(1 for j in range(rank - 1) if self.turns[j] > turn and self.starts[j] > start)


def forecast(snapshot: Snapshot, rules: Rules) -> list[float]:
    """When each of the snapshot's waiting jobs should start, in seconds from now, in fair order."""
    return plan(snapshot, rules).starts


def plan(snapshot: Snapshot, rules: Rules) -> Plan:
    """The forecast, with the order the snapshot's waiting jobs start in."""
    play = _Forecast(snapshot, rules)
    starts = play.run()
    return Plan(starts, play.turns, all(turn == n for n, turn in enumerate(play.turns)))


def eta_at(starts: list[float], position: int) -> float:
    """The forecast start of the job at `position` (1: next), extrapolated past the jobs played forward."""
    if not starts:
        return 0.0
    if position <= len(starts):
        return round(starts[position - 1], 3)
    tail = sorted(starts[len(starts) // 2 :])
    gap = (tail[-1] - tail[0]) / (len(tail) - 1) if len(tail) > 1 else 0.0
    return round(max(starts) + gap * (position - len(starts)), 3)


class _Forecast:
    """One play of the batch forward in time (events: a job joins, a job ends)."""

    def __init__(self, snapshot: Snapshot, rules: Rules) -> None:
        self.models, self.rules = snapshot.models, rules
        self.devices = {d["name"]: self._device(d) for d in snapshot.devices}
        if not self.devices:  # no worker is alive: one will come, with nothing loaded
            self.devices[""] = _Device(rules.slots, set(), {})
        for r in snapshot.running:
            self._place(r)
        for device in self.devices.values():
            if not device.runs:
                continue
            speed = self.speed(device, device.model)
            owed = sum(
                padded(device.reading[k : k + PREFILL_BATCH]) for k in range(0, len(device.reading), PREFILL_BATCH)
            )
            device.busy_s += max(owed * speed.per_prompt_token_s - device.reading_s, 0.0)
            # a job joins between two steps: after the one going on now, which may be reading prompts (at most
            # step_prefill tokens of them)
            device.step_ends = min(device.busy_s, self.rules.step_prefill * speed.per_prompt_token_s)
        self.waiting = deque(enumerate(snapshot.waiting))  # (the index of a job set aside in the play: -1)
        self.asked = len(snapshot.waiting)  # the snapshot's waiting jobs not started yet
        self.starts = [0.0] * len(snapshot.waiting)
        self.turns = [0] * len(snapshot.waiting)
        self.turn = 0
        self.blocked = snapshot.blocked
        self.blocked_since = -snapshot.blocked_s  # (sim time: 0 is now)
        self.t = 0.0

    def _device(self, d: dict[str, Any]) -> _Device:
        pace: dict[str, Speed] = {}
        try:
            told = json.loads(d.get("pace") or "{}")
        except ValueError:
            told = {}
        for model, raw in told.items() if isinstance(told, dict) else ():
            if (speed := Speed.parse(raw)) is not None:
                pace[model] = speed
        loaded = {m for m in str(d.get("models") or "").split(",") if m}
        return _Device(int(d.get("slots") or 0) or self.rules.slots, loaded, pace)

    def speed(self, device: _Device, model: str) -> Speed:
        """The model's pace on the device as measured there; else as measured last (on any device); else as its
        running jobs show it (their tokens so far over the time since their first); else FALLBACK."""
        known = self.models.get(model)
        return (
            device.pace.get(model)
            or (known.pace if known and known.pace else None)
            or device.seen.get(model)
            or Speed(*FALLBACK)
        )

    def lengths(self, model: str) -> Lengths:
        known = self.models.get(model)
        return known.lengths if known else Lengths()

    def _place(self, r: dict[str, Any]) -> None:
        """A running job, on its device: its expected tokens left, and the prefill it may still owe."""
        device = self.devices.get(r.get("device") or "") or next(iter(self.devices.values()))
        model, done, max_tokens = r["model"], int(r["done"]), int(r["max_tokens"])
        left = self.lengths(model).left(max_tokens, done, bool(r["ignore_eos"]))
        prompt = int(r["prompt_tokens"]) or int(int(r["prompt_chars"]) / self.lengths(model).chars_per_token)
        if done == 0:  # still reading its prompt, maybe
            device.reading.append(prompt - int(r["cached_tokens"]))
            device.reading_s = max(device.reading_s, float(r["age"]))
        elif done > 1 and float(r["generating_s"]) > 0 and model not in device.seen:
            step_s = float(r["generating_s"]) / (done - 1)  # (its first token came with its prompt)
            device.seen[model] = Speed(step_s, 0.0, step_s * FALLBACK[2] / FALLBACK[0])
        # what it goes back to the queue as, should it be set aside (its tokens so far are added then)
        job = Waiting(
            f"running:{len(device.runs)}:{r.get('device') or ''}",
            model,
            max_tokens,
            0,
            bool(r["ignore_eos"]),
            int(r["prompt_chars"]),
            0,
            bool(r.get("batch")),
            int(r.get("preemptions") or 0),
            False,
            prompt,
        )
        device.runs.append(_Run(left, model, prompt + max_tokens, job, prompt, float(done)))

    def run(self) -> list[float]:
        while self.asked:
            self._join()
            if not self.asked:
                break
            if not self._advance():  # nothing runs and nothing could join: it cannot be played on
                break
        for index, _ in self.waiting:  # (only when nothing moves: start them now)
            if index >= 0:
                self.starts[index], self.turns[index] = self.t, self.turn
                self.turn += 1
        return self.starts

    def _join(self) -> None:
        """Every waiting job that can join a batch now joins it, in fair order; an interactive one may take a
        batch-class job's slot."""
        progress = True
        while progress and self.asked:
            progress = False
            for device in self.devices.values():
                picked = self._pick(device)
                if picked is not None:
                    self._start(device, picked)
                elif (urgent := self._urgent(device)) is not None:
                    self._start(device, *urgent)
                else:
                    continue
                progress = True
                if not self.asked:
                    return

    def _cap(self, device: _Device, model: str) -> int:
        """The jobs the device's batch holds at most (one, of a model whose jobs run alone)."""
        known = self.models.get(device.model if device.runs else model)
        return 1 if known is not None and known.alone else device.slots

    def _pick(self, device: _Device) -> int | None:
        """Where in the waiting line the next job this device takes now stands, if any."""
        _, head = self.waiting[0]
        if len(device.runs) >= self._cap(device, head.model):
            return None
        if not device.runs or device.model == head.model:
            return 0 if self._fits(device, head) else None
        # the head needs another model: jobs of the batch's model go ahead of it for the switch wait, then it drains
        if self.blocked != head.id:
            self.blocked, self.blocked_since = head.id, self.t
        if self.t - self.blocked_since >= self.rules.switch_wait_s:
            return None
        for place, (_, job) in enumerate(islice(self.waiting, 1, None), start=1):  # (wherever it stands: claim.lua
            if job.model == device.model:  # takes the batch's model's next job from that model's own queue)
                return place if self._fits(device, job) else None
        return None

    def _urgent(self, device: _Device) -> tuple[int, list[_Run]] | None:
        """When no job may join the device's batch as it is: the first interactive job of its model within the
        first LOOK_AHEAD waiting, and the batch-class runs it sets aside to make room (the cheapest first, as few as it
        takes; none if it fits as it is), if the batch holds any that may be (worker/runner/preemption.py, claim.lua)."""
        victims = [r for r in device.runs if r.job.batch and r.job.preemptions < self.rules.preempt_limit]
        if not victims:
            return None
        _, head = self.waiting[0]
        if head.model != device.model:  # (as in _pick) the head waits for its model: for the switch wait, at most
            if self.blocked != head.id:
                self.blocked, self.blocked_since = head.id, self.t
            if self.t - self.blocked_since >= self.rules.switch_wait_s:  # then the batch drains
                return None
        place = next(
            (
                p
                for p, (_, job) in enumerate(islice(self.waiting, LOOK_AHEAD))
                if job.interactive and job.model == device.model
            ),
            None,
        )
        if place is None:
            return None
        job, cap = self.waiting[place][1], self._cap(device, device.model)
        chosen = set_aside(
            victims,
            held=lambda r: r.tokens,
            room=lambda out: len(device.runs) - len(out) < cap and self._fits(device, job, out),
        )
        return None if chosen is None else (place, chosen)

    def _fits(self, device: _Device, job: Waiting, without: Sequence[_Run] = ()) -> bool:
        costs = [r.kv for r in device.runs if r not in without]
        return fits(self._prompt_tokens(job) + job.max_tokens, costs, self.rules.kv_budget)

    def _prompt_tokens(self, job: Waiting) -> int:
        return (job.prompt_tokens or max(int(job.prompt_chars / self.lengths(job.model).chars_per_token), 1)) + job.done

    def _start(self, device: _Device, place: int, set_aside: list[_Run] | None = None) -> None:
        """The job at `place` joins the device's batch; the runs `set_aside` leave it for the front of the line."""
        index, job = self.waiting[place]
        del self.waiting[place]
        if not device.runs and job.model not in device.loaded:  # it loads first
            known = self.models.get(job.model)
            device.busy_s += known.load_left_s if known else 0.0
            device.loaded.add(job.model)
        speed, lengths = self.speed(device, job.model), self.lengths(job.model)
        # into an empty batch once its model is loaded; into a running one between two steps
        start = self.t + device.busy_s if not device.runs else max(self.t, device.step_ends)
        if index >= 0:
            self.starts[index], self.turns[index] = start, self.turn
            self.turn += 1
            self.asked -= 1
        for r in reversed(set_aside or []):  # back to the queue at their old places: the front, with their tokens
            device.runs.remove(r)
            back = replace(r.job, done=int(r.done), preemptions=r.job.preemptions + 1, kept=True)
            self.waiting.appendleft((-1, back))
        cached = self._prompt_tokens(job) if job.kept else int(job.cached_chars / lengths.chars_per_token)
        uncached = max(self._prompt_tokens(job) - cached, 1)
        if device.joining_at != self.t or len(device.joining) == PREFILL_BATCH:  # read side by side, padded
            device.joining, device.joining_at = [], self.t
        before = padded(device.joining)
        device.joining.append(uncached)
        device.busy_s += (padded(device.joining) - before) * speed.per_prompt_token_s
        left = lengths.left(job.max_tokens, job.done, job.ignore_eos)
        prompt = self._prompt_tokens(job) - job.done
        device.runs.append(_Run(left, job.model, prompt + job.done + job.max_tokens, job, prompt, float(job.done)))

    def _per_token(self, device: _Device) -> float:
        """The seconds a token of each running job takes on `device`: a step at its batch size, over the tokens a
        sequence gets a step (more than one where it keeps proposals)."""
        speed = self.speed(device, device.model)
        return speed.step(len(device.runs)) / speed.tokens_per_step

    def _advance(self) -> bool:
        """Play time on to the next job's end (on any device); False if nothing runs."""
        ends = [
            device.busy_s + min(r.left for r in device.runs) * self._per_token(device)
            for device in self.devices.values()
            if device.runs
        ]
        if not ends:
            return False
        dt = min(ends)
        for device in self.devices.values():
            if not device.runs:
                continue
            owed = min(device.busy_s, dt)
            device.busy_s -= owed
            tokens = (dt - owed) / self._per_token(device)
            for r in device.runs:
                r.left -= tokens
                r.done += tokens
            device.runs = [r for r in device.runs if r.left > 1e-6]
        self.t += dt
        return True
