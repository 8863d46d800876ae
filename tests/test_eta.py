"""The ETA: played forward from what the device is doing (its batch's tokens left at its measured pace, the
prefill still to do, its slots, the fair order, a model to load), and told again as it moves."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tasks import keys
from tasks.eta import Lengths, Rules, Snapshot, eta_at, forecast, plan
from tasks.job import JobSpec, JobStatus, SamplingParams
from tasks.store import Store
from tasks.store.jobs import Standing
from tests.helpers import BUSY, EventStream, claim_now, wait_event
from tests.test_stream import measured_pace
from web.feed import REFRESH_S
from web.follow import RETELL_S

RULES = Rules(slots=1, kv_budget=65536, switch_wait_s=10.0)
PACE = [0.1, 0.0, 0.001]  # 100 ms a step whatever the batch, 1 ms a prompt token


def snapshot(
    running: list[dict[str, Any]] = (),  # type: ignore[assignment]
    waiting: list[dict[str, Any]] = (),  # type: ignore[assignment]
    slots: int = 1,
    loaded: str = "m",
    lengths: list[str] = (),  # type: ignore[assignment]
    **more: Any,
) -> Snapshot:
    models = {m: {"pace": json.dumps(PACE), "load_s": 5.0 if m == "other" else 0, "lengths": list(lengths)}
              for m in ("m", "other")}  # fmt: skip
    device = {"name": "d", "slots": slots, "active": "", "models": loaded, "pace": ""}
    run = {"model": "m", "device": "d", "done": 0, "prompt_tokens": 0, "cached_tokens": 0, "age": 0.0,
           "ignore_eos": True, "prompt_chars": 0, "generating_s": 0.0}  # fmt: skip
    wait = {"model": "m", "max_tokens": 10, "done": 0, "ignore_eos": True, "prompt_chars": 0, "cached_chars": 0}
    raw = {
        "devices": [device],
        "running": [{**run, **r} for r in running],
        "waiting": [{**wait, "id": f"w{n}", **w} for n, w in enumerate(waiting)],
        "models": models,
        **more,
    }
    return Snapshot.parse(json.dumps(raw))


def test_a_job_starts_when_the_tokens_left_ahead_of_it_are_generated():
    # one slot: a job with 20 tokens left, then two of 10 tokens each ahead of the last
    taken = snapshot(running=[{"max_tokens": 30, "done": 10}], waiting=[{"max_tokens": 10}] * 3)
    assert forecast(taken, RULES) == pytest.approx([2.0, 3.0, 4.0], abs=0.01)  # (and a token's prefill each)


def test_slots_free_in_turn_and_the_next_job_takes_the_first_one_that_does():
    running = [{"max_tokens": 10}, {"max_tokens": 40}]
    taken = snapshot(running=running, waiting=[{"max_tokens": 10}] * 3, slots=2)
    # the short job's slot frees at 1 s: the waiting jobs take it one after another, the long one runs on to 4 s
    assert forecast(taken, Rules(2, 65536, 10.0)) == pytest.approx([1.0, 2.0, 3.0], abs=0.01)


def test_the_jobs_of_a_model_that_runs_alone_take_one_slot_at_a_time():
    running, waiting = [{"max_tokens": 10}], [{"max_tokens": 10}] * 2
    taken = snapshot(running=running, waiting=waiting, slots=4)
    assert forecast(taken, Rules(4, 65536, 10.0)) == pytest.approx([0.0, 0.0], abs=0.01)  # batched: they join now
    raw = json.loads(json.dumps({"models": {"m": {"pace": json.dumps(PACE), "batching": "alone"}}}))
    alone = snapshot(running=running, waiting=waiting, slots=4, models=raw["models"])
    assert forecast(alone, Rules(4, 65536, 10.0)) == pytest.approx([1.0, 2.0], abs=0.01)  # alone: one after another


def test_answers_that_end_by_themselves_shorten_the_estimate():
    # recent answers of the model stopped after 10 tokens (how 's'), though 100 were allowed
    ended = ["10,100,s,40,10"] * 9
    taken = snapshot(running=[{"max_tokens": 100, "ignore_eos": False}], waiting=[{"max_tokens": 100}], lengths=ended)
    assert forecast(taken, RULES)[0] == pytest.approx(0.1 * (9 * 10 + 100) / 10)  # nine answers and the prior
    # with ignore_eos a job goes to its max_tokens, whatever answers do
    assert forecast(snapshot(running=[{"max_tokens": 100}], waiting=[{}], lengths=ended), RULES)[0] == 10.0


def test_a_job_that_got_further_than_recent_answers_is_expected_to_go_on():
    lengths = Lengths(((10, 100, "s"), (50, 100, "s"), (100, 100, "l")))
    assert lengths.left(100) == pytest.approx((10 + 50 + 100 + 100) / 4)
    assert lengths.left(100, done=20) == pytest.approx((50 + 100 + 100) / 3 - 20)  # the answer of 10 tells nothing
    assert lengths.left(100, done=100) == 0


def test_prefill_counts_the_part_of_the_prompt_a_cache_does_not_hold():
    prompt = {"max_tokens": 10, "prompt_chars": 4000}  # 1000 tokens at 4 characters a token: 1 s
    cold = forecast(snapshot(running=[{"max_tokens": 10}], waiting=[prompt, {"max_tokens": 10}]), RULES)
    warm = forecast(
        snapshot(running=[{"max_tokens": 10}], waiting=[{**prompt, "cached_chars": 3600}, {"max_tokens": 10}]), RULES
    )
    assert cold[1] - cold[0] == pytest.approx(1.0 + 1.0)
    assert warm[1] - warm[0] == pytest.approx(0.1 + 1.0)
    # a running job still reading its prompt owes what it has not read
    reading = {"max_tokens": 10, "prompt_tokens": 3000, "cached_tokens": 1000, "age": 0.5}
    assert forecast(snapshot(running=[reading], waiting=[{}]), RULES)[0] == pytest.approx(1.5 + 1.0)


def test_jobs_join_a_running_batch_after_the_step_going_on_all_together():
    reading = {"max_tokens": 10, "prompt_tokens": 700, "age": 0.2}  # its step reads its prompt: 0.5 s left
    taken = snapshot(running=[reading], waiting=[{"prompt_chars": 4000}] * 3, slots=4)
    assert forecast(taken, Rules(4, 65536, 10.0)) == pytest.approx([0.5, 0.5, 0.5])


def test_a_job_of_another_model_waits_for_the_batch_to_drain_and_its_model_to_load():
    running = [{"max_tokens": 20}]
    taken = snapshot(running=running, waiting=[{"model": "other", "max_tokens": 10}], slots=4)
    assert forecast(taken, Rules(4, 65536, 10.0)) == pytest.approx([2.0 + 5.0], abs=0.01)
    # meanwhile jobs of the batch's model go ahead of it, for the switch wait
    taken = snapshot(running=running, waiting=[{"model": "other", "max_tokens": 10}, {"max_tokens": 10}], slots=4)
    assert forecast(taken, Rules(4, 65536, 10.0)) == pytest.approx([2.0 + 5.0, 0.0], abs=0.01)
    assert forecast(taken, Rules(4, 65536, 0.0)) == pytest.approx([2.0 + 5.0, 2.0 + 5.0 + 1.0], abs=0.01)


BATCH = {"batch": True, "interactive": False}  # a batch-class job, as the snapshot tells it
PREEMPT = Rules(1, 65536, 10.0, preempt_limit=2)


def test_an_interactive_job_takes_a_batch_jobs_slot_at_the_next_step_and_the_batch_job_goes_on_later():
    # one slot, held by a batch job with 20 tokens left; behind it wait a batch job, then an interactive one
    taken = snapshot(running=[{"max_tokens": 30, "done": 10, **BATCH}], waiting=[{**BATCH}, {}])
    # without preemption the interactive job waits for both: 2 s, then 1 s
    assert forecast(taken, RULES) == pytest.approx([2.0, 3.0], abs=0.01)
    # with it, it starts now; the batch job set aside goes back to the front keeping its tokens (20 left: 1 s of the
    # interactive job's, then 2 s), and only then the waiting batch job starts
    played = plan(taken, PREEMPT)
    assert played.starts == pytest.approx([3.0, 0.0], abs=0.01)
    assert [played.position(rank) for rank in (1, 2)] == [1, 1]  # nobody starts before it: its rank was 2

    # a full batch of four: each interactive job starts after the step going on (a batch job reads its prompt:
    # 0.5 s), not when batch jobs end (9.5 s)
    reading = {"max_tokens": 100, "prompt_tokens": 700, "age": 0.2, **BATCH}
    taken = snapshot(running=[reading] + [{"max_tokens": 100, "done": 10, **BATCH}] * 3, waiting=[{}] * 2, slots=4)
    assert forecast(taken, Rules(4, 65536, 10.0)) == pytest.approx([9.5, 9.5], abs=0.01)
    assert forecast(taken, Rules(4, 65536, 10.0, preempt_limit=2)) == pytest.approx([0.5, 0.5], abs=0.01)

    # a batch full by the KV budget (room for two runs of 100 tokens), not by its slots, too
    taken = snapshot(running=[{"max_tokens": 100, **BATCH}] * 2, waiting=[{"max_tokens": 100}], slots=4)
    assert forecast(taken, Rules(4, 300, 10.0)) == pytest.approx([10.0], abs=0.01)
    assert forecast(taken, Rules(4, 300, 10.0, preempt_limit=2)) == pytest.approx([0.0], abs=0.01)


def test_the_batch_job_set_aside_is_the_cheapest():
    # two slots: a batch job with a long prompt and 90 tokens to go, another with a short one and 10; the interactive
    # job (1 s) sets the second aside (the fewest tokens to keep): it goes on at 1 s, ends at 2 s, and the batch job
    # waiting takes its slot then (had the first been set aside, both slots would free at 1 s)
    running = [{"max_tokens": 100, "done": 10, "prompt_tokens": 1000, **BATCH}, {"max_tokens": 60, "done": 50, **BATCH}]
    taken = snapshot(running=running, waiting=[{}, {**BATCH}], slots=2)
    assert forecast(taken, Rules(2, 65536, 10.0)) == pytest.approx([1.0, 2.0], abs=0.01)
    assert forecast(taken, Rules(2, 65536, 10.0, preempt_limit=2)) == pytest.approx([0.0, 2.0], abs=0.01)


def test_a_job_is_set_aside_only_if_it_is_batch_work_set_aside_fewer_times_than_the_limit():
    def starts(running: dict[str, Any], waiting: dict[str, Any] | None = None, limit: int = 2) -> list[float]:
        taken = snapshot(running=[{"max_tokens": 20, **running}], waiting=[waiting or {}])
        return forecast(taken, Rules(1, 65536, 10.0, preempt_limit=limit))

    assert starts(BATCH) == pytest.approx([0.0])  # it may be: the interactive job starts now
    assert starts(BATCH, limit=0) == pytest.approx([2.0])  # preemption is off
    assert starts({**BATCH, "preemptions": 2}) == pytest.approx([2.0])  # it was set aside as often as it may be
    assert starts({**BATCH, "preemptions": 1}) == pytest.approx([0.0])
    assert starts({}) == pytest.approx([2.0])  # interactive work is never set aside
    assert starts(BATCH, BATCH) == pytest.approx([2.0])  # batch work takes no batch job's slot
    assert starts(BATCH, {"interactive": False}) == pytest.approx([2.0])  # nor a side or solo job
    assert starts(BATCH, {"model": "other"}) == pytest.approx([2.0 + 5.0])  # nor one of another model


def test_the_snapshot_tells_batch_work_and_preemptions_and_the_forecast_plays_them(store):
    # Given one slot (the tests' batch of 1) at 10 ms a step, held by a batch job with 98 tokens to go (about 1 s),
    # a batch job waiting, and an interactive job admitted behind it (its user's last answer was long: 2,000 tokens)
    store.redis.hset(keys.model(store.settings.model_name), "pace", "[0.01, 0, 0.001]")
    batch = JobSpec(owner="a", model=store.settings.model_name, prompt="p", priority="batch",
                    params=SamplingParams(max_tokens=100, ignore_eos=True))  # fmt: skip
    spec = JobSpec(owner="b", model=store.settings.model_name, prompt="q", params=SamplingParams(max_tokens=100))
    store.admit("job_running", batch, 60)
    store.admit("job_long", spec.model_copy(update={"params": SamplingParams(max_tokens=2000)}), 60)
    assert store.for_worker("w").take_device() == "ok" and claim_now(store, "w").id == "job_long"
    assert claim_now(store, "w").id == "job_running"
    store.for_worker("w").finish(
        "job_long", JobStatus.COMPLETED, finish_reason="length", prompt_tokens=1, completion_tokens=2000
    )
    store.for_worker("w").append("job_running", (1, 2), "ab", 10)
    store.admit("job_batch", batch.model_copy(update={"params": SamplingParams(max_tokens=1)}), 60)
    asked = store.admit("job_asked", spec, 60)
    assert store.redis.zrank(keys.QUEUE, "job_asked") == 1  # second in the fair order

    # Then the snapshot tells which work is batch work, and the interactive job starts at the next step, first
    raw, *_ = store.scripts.run("position", limit=10, ids=["job_asked"])
    taken = Snapshot.parse(raw)
    assert [(w.id, w.batch, w.interactive) for w in taken.waiting] == [
        ("job_batch", True, False),
        ("job_asked", False, True),
    ]
    assert [(r.get("batch"), r.get("preemptions", 0)) for r in taken.running] == [(True, 0)]
    assert (asked.position, asked.eta_s) == (1, 0.0)

    # And where batch work is never set aside, it waits its turn: the running job's 98 tokens, then the batch job's
    never = Store(store.redis, store.settings.model_copy(update={"preempt_limit": 0}))
    assert never.standing(asked) == Standing(2, pytest.approx(0.98 + 0.011, abs=0.005))
    # once the running job was set aside as often as it may be, it waits for the running job to end (and then takes
    # the slot of the batch job that took the slot first)
    store.redis.hset(keys.job("job_running"), "preemptions", store.settings.preempt_limit)
    assert Snapshot.parse(store.scripts.run("position", limit=10, ids=["job_asked"])[0]).running[0]["preemptions"] == 2
    assert store.standing(asked) == Standing(2, pytest.approx(0.98, abs=0.005))


def test_a_position_beyond_those_played_forward_is_extrapolated():
    assert eta_at([1.0, 2.0, 3.0, 4.0], 2) == 2.0
    assert eta_at([1.0, 2.0, 3.0, 4.0], 10) == pytest.approx(10.0)


# --- against a real worker ----------------------------------------------------------------------------------------


def test_without_a_worker_no_eta_is_made_up(jobs):
    assert jobs.submit("nobody runs me", max_tokens=4)["eta_s"] is None  # no worker holds the device


def test_a_model_is_timed_as_it_loads_one_sequence_a_prompt_read_and_a_full_batch(engine):
    from worker.pace import PROBE_PROMPT, probe

    steps = probe(engine.model, max_batch=4, prefill_step=512)
    assert {n for n, prefill, _ in steps if prefill == 0} == {1, 4}  # decode steps at both ends of the batch
    assert [prefill for _, prefill, _ in steps if prefill] == [PROBE_PROMPT - 1]  # (its last token: the first decode)
    assert all(seconds > 0 for _, _, seconds in steps)


def test_a_fresh_worker_tells_its_models_pace_before_its_first_job(settings, store, model, start_worker):
    # Given a worker that loads its model itself (the way a server starts), before any job
    worker = start_worker(settings)

    # Then the model's pace is told already, on the device and on the model: measured on its own steps as it
    # loaded (how close it comes to the wait is bench/eta.py --fresh's to say: a tiny model's steps on a shared
    # machine vary too much for a test)
    told = store.redis.hget(keys.model(model), "pace")
    assert told is not None, "no pace before the first job: the first ETAs would be a guess"
    assert json.loads(told) == worker.runner.pace.speeds()[model].as_list()
    assert json.loads(store.redis.hget(keys.device(settings.device), "pace"))[model] == json.loads(told)
    step_s, per_sequence_s, per_prompt_token_s, _ = json.loads(told)
    assert step_s + per_sequence_s > 0 and per_prompt_token_s > 0


def test_the_first_job_on_a_fresh_server_starts_now(jobs, start_worker):
    start_worker()  # nothing measured yet, nothing running
    assert jobs.submit("first", max_tokens=4)["eta_s"] == 0.0


def test_a_waiting_stream_is_told_its_eta_again_as_the_batch_runs(jobs, store, start_worker, live_server):
    # Given a worker busy with a job of about 40 s at its measured pace (a pace measured early can be slow: one such
    # "20 s" job ended in 7 s, before the stream was told its ETA four times), and a job waiting behind it, followed
    start_worker()
    warm = jobs.submit("warm", max_tokens=BUSY, ignore_eos=True)
    wait_event(store, warm["id"], lambda e: e.type == "token")
    step_s, per_sequence_s, _, per_step = measured_pace(store)  # (per_step: tokens a sequence gets a step)
    jobs.cancel(warm["id"])
    busy = jobs.submit("busy", max_tokens=int(40 * per_step / (step_s + per_sequence_s)), ignore_eos=True)
    wait_event(store, busy["id"], lambda e: e.type == "token")
    waiting = jobs.submit("next", max_tokens=4)
    stream = EventStream(live_server, waiting["id"])

    # When the queue does not move until the busy job ends
    told = []  # (when, eta_s) of each `queued` event
    for item in stream:
        if item.get("event") == "queued":
            told.append((time.monotonic(), item["data"]["eta_s"]))
        if item.get("event") == "started" or len(told) == 4:
            break
    jobs.cancel(busy["id"])
    stream.close()

    # Then the stream was told its ETA again, at least every RETELL_S (and the hub's refresh), as it moved
    assert len(told) == 4, told
    assert all(later - earlier <= RETELL_S + REFRESH_S + 1 for (earlier, _), (later, _) in zip(told, told[1:]))
    assert len({eta for _, eta in told}) > 1  # not the one figure over and over
