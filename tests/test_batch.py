"""The continuous batch: several jobs generate together on the one device, and every per-job guarantee holds."""

from __future__ import annotations

import os
import random
import signal

import pytest

from bench.harness import generate
from tasks import keys
from tasks.job import JobSpec, SamplingParams
from tasks.scheduling import kv_tokens
from tests.helpers import wait_ended, wait_event
from tests.test_recovery import wait_for_worker

WORDS = "the queue keeps the gpu busy and users informed a job waits starts streams tokens then ends".split()


def prompts(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 150))) for _ in range(n)]


def alone(engine, prompt: str, **params) -> str:  # type: ignore[no-untyped-def]
    """The job's output when it runs by itself: a batch of one, through the same engine."""
    spec = JobSpec(owner="t", model="m", prompt=prompt, params=SamplingParams(**params))
    return "".join(chunk.text for chunk in generate(engine, spec))


def overlap(done: list[dict]) -> int:  # type: ignore[type-arg]
    """The most jobs that were running at the same moment, by their recorded start and end."""
    marks = sorted([(d["timings"]["started_at"], 1) for d in done] + [(d["timings"]["finished_at"], -1) for d in done])
    most = running = 0
    for _, step in marks:
        running += step
        most = max(most, running)
    return most


def test_greedy_output_in_a_batch_is_token_identical_to_the_job_run_alone(jobs, store, start_worker, engine):
    # 20 prompts of mixed lengths, with different lengths to generate: they join and leave the batch mid-flight
    texts = prompts(20)
    lengths = [5 + (17 * n) % 60 for n in range(20)]
    start_worker(max_batch=6)
    ids = [jobs.submit(text, max_tokens=n, ignore_eos=True)["id"] for text, n in zip(texts, lengths)]
    done = [wait_ended(store, job_id) for job_id in ids]

    assert overlap(done) > 1, "the jobs never shared the batch"
    for d, text, n in zip(done, texts, lengths):
        assert d["status"] == "completed" and d["usage"]["completion_tokens"] == n
        assert d["output"] == alone(engine, text, max_tokens=n, ignore_eos=True), d["id"]


def test_a_seeded_job_gives_the_same_output_whatever_shares_its_batch(jobs, store, start_worker, engine):
    seeded = {"max_tokens": 40, "temperature": 1.0, "top_p": 0.9, "seed": 1234, "ignore_eos": True}
    start_worker(max_batch=4)
    outputs = []
    for companions in (0, 3, 3):
        others = [
            jobs.submit(p, max_tokens=60, temperature=1.0, ignore_eos=True, **({"seed": n} if n % 2 else {}))
            for n, p in enumerate(prompts(companions, seed=len(outputs)))
        ]
        job = jobs.submit("once upon a time", **seeded)
        outputs.append(wait_ended(store, job["id"])["output"])
        for other in others:
            wait_ended(store, other["id"])

    assert outputs[0] == outputs[1] == outputs[2] == alone(engine, "once upon a time", **seeded)
    assert alone(engine, "once upon a time", **{**seeded, "seed": 99}) != outputs[0]  # the seed does matter


def test_cancelling_a_job_in_a_full_batch_stops_it_before_the_next_step_and_leaves_the_others_alone(
    jobs, store, start_worker, engine, settings
):
    texts = prompts(4, seed=3)
    start_worker(max_batch=4)
    ids = [jobs.submit(text, max_tokens=400, ignore_eos=True)["id"] for text in texts]
    victim = ids[1]
    store.follow_live(store.get(victim))  # followed as it runs (else its count is written once a second)
    wait_event(store, victim, lambda e: e.type == "token" and store.get(victim).usage.completion_tokens >= 20)

    assert jobs.cancel(victim).get_json()["status"] == "cancelled"

    cancelled = wait_ended(store, victim)
    heard_at = int(store.redis.hget(keys.job(victim), "stop_seen_at"))
    # (the step under way when it was heard ends: one token, or its kept proposals and one: worker/batch/speculation.py)
    assert cancelled["usage"]["completion_tokens"] - heard_at <= 1 + settings.speculate
    for job_id, text in zip(ids, texts):
        if job_id != victim:
            d = wait_ended(store, job_id)
            assert d["status"] == "completed" and d["output"] == alone(engine, text, max_tokens=400, ignore_eos=True)


def test_stop_strings_time_limits_and_ignore_eos_hold_per_job_inside_a_batch(jobs, store, start_worker, engine):
    eos = set(engine.tokenizer.eos_token_ids)
    text = alone(engine, "stop here", max_tokens=60, ignore_eos=True)
    stop = text[20:23]  # a stop string the greedy output is known to reach (maybe across token boundaries)
    start_worker(max_batch=4, job_time_limit_s=0.5)
    long = jobs.submit("long", max_tokens=4000, ignore_eos=True)
    stopped = jobs.submit("stop here", max_tokens=60, ignore_eos=True, stop=stop)
    plain = jobs.submit("plain", max_tokens=30, ignore_eos=True)

    assert wait_ended(store, stopped["id"])["output"] == text[: text.index(stop)]
    assert wait_ended(store, stopped["id"])["finish_reason"] == "stop"
    assert wait_ended(store, plain["id"])["usage"]["completion_tokens"] == 30
    over = wait_ended(store, long["id"])
    assert over["status"] == "failed" and over["error"]["type"] == "time_limit"
    assert set(engine.tokenizer.eos_token_ids) == eos  # ignore_eos never touched the shared tokenizer


def test_claims_follow_the_fair_order_with_several_slots(jobs, store, start_worker):
    plan = ["alice"] * 6 + ["bob"] * 2 + ["carol"] * 2
    ids = [
        store.admit(
            f"job_{n:02d}",
            JobSpec(
                owner=owner,
                model=store.settings.model_name,
                prompt=f"{owner} {n}",
                params=SamplingParams(max_tokens=20, ignore_eos=True),
            ),
            60,
        ).id
        for n, owner in enumerate(plan)
    ]
    owner = dict(zip(ids, plan))

    start_worker(max_batch=2)
    done = {job_id: wait_ended(store, job_id) for job_id in ids}

    order = sorted(ids, key=lambda job_id: done[job_id]["timings"]["started_at"])
    # one turn each, then a second each (which of the three goes first depends on when the first turns' answers
    # were charged: as they end), then alice's rest
    turns = [owner[j][0] for j in order]
    assert turns[:3] == list("abc") and sorted(turns[3:6]) == list("abc") and turns[6:] == list("aaaa"), turns
    assert overlap(list(done.values())) == 2


def test_the_kv_budget_holds_at_every_step(jobs, store, start_worker, engine, monkeypatch):
    # budget 300 tokens: two jobs of ~110 fit together, a third waits for a slot to free; one of 400 runs alone
    worker = start_worker(max_batch=8, kv_budget_tokens=300)
    held = watch_batch(worker, engine, monkeypatch)
    small = [jobs.submit(f"a b c {n}", max_tokens=100, ignore_eos=True)["id"] for n in range(4)]
    big = jobs.submit("big", max_tokens=400, ignore_eos=True)["id"]
    done = [wait_ended(store, job_id) for job_id in [*small, big]]

    assert all(d["status"] == "completed" for d in done)
    assert max(len(ids) for ids, _ in held) == 2  # never three of the small ones
    assert all(kv <= 300 for ids, kv in held if len(ids) > 1)  # the budget held whenever jobs shared the batch
    assert any(kv > 300 for ids, kv in held if len(ids) == 1)  # the big one ran, alone
    assert overlap(done[:4]) == 2


def test_the_kv_budget_counts_every_job_padded_to_the_longest(jobs, store, start_worker, engine, monkeypatch):
    # one job of ~135 tokens and three of ~45: 270 summed, but a batch pads every sequence to the longest, so
    # with the long one in it, two jobs (2 x 135) fit a budget of 300, not four
    worker = start_worker(max_batch=8, kv_budget_tokens=300)
    held = watch_batch(worker, engine, monkeypatch)
    long = jobs.submit("a longer job", max_tokens=130, ignore_eos=True)["id"]
    short = [jobs.submit(f"s {n}", max_tokens=40, ignore_eos=True)["id"] for n in range(3)]
    done = [wait_ended(store, job_id) for job_id in [long, *short]]

    assert all(d["status"] == "completed" for d in done)
    assert max(len(ids) for ids, _ in held if long in ids) == 2


def watch_batch(worker, engine, monkeypatch) -> list[tuple[set[str], int]]:  # type: ignore[no-untyped-def]
    """Before every step: the jobs in the batch and the KV tokens it may come to hold."""
    held: list[tuple[set[str], int]] = []
    step = engine.step

    def watched_step():  # type: ignore[no-untyped-def]
        held.append((set(worker.runner.batch.by_job), int(kv_tokens(worker.runner.batch.costs()))))
        return step()

    monkeypatch.setattr(engine, "step", watched_step)
    return held


def test_a_failing_batch_step_fails_only_the_guilty_job_and_costs_the_others_no_attempt(
    jobs, store, start_worker, monkeypatch
):
    import worker.batch.engine as engine_module

    make = engine_module.make_sampler

    def sampler_for(params, drawn=0):  # type: ignore[no-untyped-def]
        if params.seed == 666:  # the poison job: its sampler breaks every step it takes part in

            def broken(logprobs):  # type: ignore[no-untyped-def]
                raise RuntimeError("poison")

            return broken
        return make(params, drawn)

    monkeypatch.setattr(engine_module, "make_sampler", sampler_for)
    start_worker(max_batch=4, max_attempts=3)
    good = [jobs.submit(f"good {n}", max_tokens=30, ignore_eos=True)["id"] for n in range(3)]
    poison = jobs.submit("poison", max_tokens=30, temperature=1.0, seed=666, ignore_eos=True)["id"]

    bad = wait_ended(store, poison)
    assert bad["status"] == "failed" and bad["error"]["type"] == "generation_error"
    assert "poison" not in bad["error"]["message"]
    for job_id in good:
        d = wait_ended(store, job_id)
        assert d["status"] == "completed" and d["usage"]["completion_tokens"] == 30 and d["attempts"] == 1
    assert store.redis.zcard(keys.IN_PROGRESS) == 0


def test_a_worker_killed_with_several_jobs_in_flight_loses_none_and_requeues_them_in_order(
    jobs, store, worker_process, settings
):
    worker_process(ONELANE_MAX_BATCH="4")
    ids = [jobs.submit(text, max_tokens=1500, ignore_eos=True)["id"] for text in prompts(4, seed=11)]
    for job_id in ids:
        wait_event(store, job_id, lambda e: e.type == "token")
    first = {job_id: store.get(job_id).timings.started_at for job_id in ids}

    os.kill(wait_for_worker(store).pid, signal.SIGKILL)

    done = [wait_ended(store, job_id, timeout_s=90) for job_id in ids]
    assert [(d["status"], d["attempts"], d["usage"]["completion_tokens"]) for d in done] == [("completed", 2, 1500)] * 4
    for d in done:
        assert [e.type for e in store.events(d["id"])].count("requeued") == 1
        assert d["timings"]["started_at"] > first[d["id"]]
    again = sorted(ids, key=lambda job_id: next(d for d in done if d["id"] == job_id)["timings"]["started_at"])
    assert again == sorted(ids, key=lambda job_id: first[job_id])  # back in their original order


def test_a_job_whose_batch_keeps_dying_fails_alone_and_its_companions_complete(jobs, store, worker_process):
    # the worker dies whenever the poison job runs (the story kills it): twice with companions in the batch,
    # which blames none of them (they all go back, to run alone), then once alone, which is the poison's own
    worker_process(ONELANE_MAX_BATCH="4")  # ONELANE_MAX_ATTEMPTS is 2
    poison = jobs.submit("poison", max_tokens=6000, ignore_eos=True)["id"]
    others = [jobs.submit(text, max_tokens=1000, ignore_eos=True)["id"] for text in prompts(3, seed=13)]

    for attempt in (1, 2, 3):
        wait_event(store, poison, lambda e: e.type == "token" and store.get(poison).attempts == attempt, 60)
        if attempt < 3:
            assert {store.get(job_id).status.value for job_id in others} == {"in_progress"}  # it had company
        os.kill(wait_for_worker(store).pid, signal.SIGKILL)

    failed = wait_ended(store, poison, timeout_s=60)
    assert (failed["status"], failed["error"]["type"], failed["attempts"]) == ("failed", "worker_crashed", 3)
    done = [wait_ended(store, job_id, timeout_s=60) for job_id in others]
    assert [(d["status"], d["attempts"]) for d in done] == [("completed", 3)] * 3
    assert overlap(done) == 1  # after the second death each ran alone


def test_position_and_eta_count_the_slots(jobs, store, start_worker):
    from tests.test_stream import at_one_pace

    start_worker(max_batch=2)
    running = [
        jobs.submit("short", max_tokens=5000, ignore_eos=True),
        jobs.submit("long", max_tokens=10000, ignore_eos=True),
    ]
    for r in running:
        store.follow_live(store.get(r["id"]))  # followed as they run (else their counts are written once a second)
    for r in running:
        wait_event(store, r["id"], lambda e: e.type == "token" and store.get(r["id"]).usage.completion_tokens >= 200)
    waiting_ids = [jobs.submit(f"w{n}", max_tokens=4, ignore_eos=True)["id"] for n in range(3)]

    # (one forecast for all three: one instant)
    pace, before, got, after = at_one_pace(store, [r["id"] for r in running], lambda: store.standings(waiting_ids))
    for r in running:
        jobs.cancel(r["id"])

    assert [g.position for g in got] == [1, 2, 3]
    etas = [g.eta_s for g in got]
    step_s, per_sequence_s, _, per_step = pace
    per_token = (step_s + 2 * per_sequence_s) / per_step  # (a step of both running jobs)
    short, long = ((m - done) * per_token for m, done in zip((5000, 10000), after, strict=True))
    # the first slot to free: the short job's, at the measured pace (the ETA is in ms)
    assert short - 0.001 <= etas[0] <= (5000 - before[0]) * per_token + 0.001
    # then each short job takes that slot in turn, a few steps each: none waits for the long job's slot
    assert etas[0] < etas[1] < etas[2] < etas[0] + 0.2 * (long - short)


def test_readyz_and_metrics_show_the_batch(jobs, store, start_worker):
    from tests.test_health import scrape

    start_worker(max_batch=3)
    ids = [jobs.submit(f"m{n}", max_tokens=2000, ignore_eos=True)["id"] for n in range(3)]
    for job_id in ids:
        wait_event(store, job_id, lambda e: e.type == "token")

    ready = jobs.client.get("/readyz").get_json()
    assert ready["workers"][0]["running"] == len(ids)
    wait_event(store, ids[0], lambda e: e.type == "token" and store.readings.snapshot().workers[0].batch == 3)
    metrics = scrape(jobs.client)
    for job_id in ids:
        jobs.cancel(job_id)

    assert metrics[f"onelane_batch_size{{device={store.settings.device}}}"] == 3
    assert metrics[f"onelane_batch_slots{{device={store.settings.device}}}"] == 3
    assert metrics[f"onelane_batch_occupancy_ratio{{device={store.settings.device}}}"] == 1.0
    assert metrics["onelane_tokens_generated_total"] > 0  # (its rate is the tokens per second)
    assert metrics["onelane_decode_seconds_total"] > 0 and metrics["onelane_prefill_seconds_total"] > 0
    assert metrics["onelane_prefill_tokens_total"] > 0 and metrics["onelane_batch_steps_total"] > 0


@pytest.mark.timeout(400)
def test_a_worker_stopping_in_good_order_hands_its_batch_back_without_costing_an_attempt(jobs, store, start_worker):
    first = start_worker(max_batch=2, drain_s=0.2)  # it lets its batch run this long to end
    ids = [jobs.submit(text, max_tokens=3000, ignore_eos=True)["id"] for text in prompts(2, seed=5)]
    for job_id in ids:
        wait_event(store, job_id, lambda e: e.type == "token")

    first.stop()

    back = [store.get(job_id) for job_id in ids]
    assert [(j.status.value, j.attempts, j.position) for j in back] == [("queued", 0, 1), ("queued", 0, 2)]
    start_worker(max_batch=2)
    done = [wait_ended(store, job_id, timeout_s=240) for job_id in ids]  # 6,000 tokens, on a machine maybe busy
    assert [(d["status"], d["attempts"], d["usage"]["completion_tokens"]) for d in done] == [("completed", 1, 3000)] * 2
