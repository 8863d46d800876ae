"""Interactive work never waits behind batch work (issue 51): when an interactive job finds no slot free, a batch-class
job in the batch is set aside within a step. It goes back to the queue keeping its tokens (and its KV state in the
prefix cache), is not counted as an attempt, and later goes on exactly where it stopped; it is set aside at most
ONELANE_PREEMPT_LIMIT times. (One slot here: the fixture's batch of 1.) Its jobs speculate whatever it costs this
machine (ONELANE_SPECULATE_ALWAYS): a job set aside goes on exactly with proposals checked and cut, as without."""

from __future__ import annotations

import os
import signal

import pytest

from tasks import keys
from tasks.catalogue import SHIPPED_DEMO_MODEL
from tests.helpers import EventStream, wait_ended, wait_event
from tests.test_recovery import wait_for_worker
from tests.test_resume import logged_text


@pytest.fixture
def settings(settings):  # type: ignore[no-untyped-def]
    """The shipped demo model, which writes words as it goes (the random one's bytes make text only at its end),
    speculating always."""
    return settings.model_copy(update={"model": str(SHIPPED_DEMO_MODEL), "speculate_always": True})


@pytest.fixture(scope="module")
def engine():  # type: ignore[no-untyped-def]
    from worker.batch.engine import Engine

    return Engine.load(str(SHIPPED_DEMO_MODEL))


LONG = {"prompt": "The queue", "max_tokens": 600, "ignore_eos": True}


def running(store, job_id: str, tokens: int = 2) -> None:  # type: ignore[no-untyped-def]
    """Until the job has written `tokens` tokens (it runs: it holds the slot), followed live as a stream would."""
    store.follow_live(store.get(job_id))  # (else its tokens are written in quiet windows, not as they come)
    wait_event(store, job_id, lambda e: e.type == "token" and store.get(job_id).usage.completion_tokens >= tokens, 60)


def preempted(store, job_id: str) -> list:  # type: ignore[no-untyped-def]
    return [e for e in store.events(job_id) if e.type == "requeued" and e.reason == "preempted"]


@pytest.mark.parametrize("params", [{"temperature": 0}, {"temperature": 0.9, "seed": 7}], ids=["greedy", "seeded"])
def test_a_batch_job_set_aside_for_an_interactive_one_goes_on_exactly_where_it_stopped(
    params, jobs, store, start_worker
):
    # Given the answer a batch job gives uninterrupted
    start_worker()
    whole = wait_ended(store, jobs.submit(**LONG, **params, priority="batch")["id"], timeout_s=120)["output"]

    # When the same batch job holds the only slot, and an interactive question arrives
    batch = jobs.submit(**LONG, **params, priority="batch")["id"]
    running(store, batch)
    question = jobs.submit("Who waits?", max_tokens=8)["id"]

    # Then the question runs at once, before the batch job ends
    asked = wait_ended(store, question, timeout_s=60)
    assert asked["status"] == "completed"
    done = wait_ended(store, batch, timeout_s=120)
    assert asked["timings"]["finished_at"] < done["timings"]["finished_at"]

    # And the batch job was set aside once, not counted as an attempt, and wrote exactly its uninterrupted answer
    assert len(preempted(store, batch)) == 1
    assert (done["status"], done["attempts"], done["preemptions"]) == ("completed", 1, 1)
    assert done["usage"]["completion_tokens"] == 600
    assert done["output"] == whole == logged_text(store, batch)
    if not params["temperature"]:  # (its steps checked proposals, and kept some: a greedy answer copies itself)
        assert done["timings"]["accepted_tokens"] > 0


def test_interactive_work_is_never_set_aside(jobs, store, start_worker):
    # Given an interactive job holding the only slot
    start_worker()
    first = jobs.submit(**LONG, temperature=0)["id"]
    running(store, first)

    # When another interactive job arrives, it waits for the slot: the first is not set aside
    second = jobs.submit("Who waits?", max_tokens=8)["id"]
    one, two = wait_ended(store, first, timeout_s=120), wait_ended(store, second, timeout_s=60)
    assert one["timings"]["finished_at"] <= two["timings"]["started_at"]
    assert not preempted(store, first) and one["preemptions"] == 0
    assert store.redis.hget(keys.STATS, "preempted") is None


def test_a_batch_job_is_set_aside_at_most_the_limit_then_keeps_its_slot(jobs, store, start_worker):
    # Given a limit of one preemption, and a batch job set aside once already for a question
    start_worker(preempt_limit=1)
    batch = jobs.submit(**LONG, temperature=0, priority="batch")["id"]
    running(store, batch)
    first = jobs.submit("Who waits?", max_tokens=8)["id"]
    wait_ended(store, first, timeout_s=60)
    running(store, batch, tokens=store.get(batch).usage.completion_tokens + 2)  # it runs again

    # When a second question arrives, the batch job keeps its slot: the question waits for it to end
    second = jobs.submit("And who else?", max_tokens=8)["id"]
    done, asked = wait_ended(store, batch, timeout_s=120), wait_ended(store, second, timeout_s=60)
    assert done["timings"]["finished_at"] <= asked["timings"]["started_at"]
    assert (done["status"], done["preemptions"], len(preempted(store, batch))) == ("completed", 1, 1)

    # And /metrics and the dashboard count the one preemption, and each flow's service in tokens
    assert "onelane_jobs_preempted_total 1.0" in jobs.client.get("/metrics").get_data(as_text=True)
    fairness = jobs.client.get("/queue.json").get_json()["fairness"]
    assert fairness["preemptions"] == 1
    service = {(f["owner"], f["priority"]): f["tokens"] for f in fairness["flows"]}
    assert service[("local", "batch")] > service[("local", "interactive")] > 0


def test_a_set_aside_job_whose_client_went_is_dropped_before_it_runs_again(jobs, store, start_worker, live_server):
    # Given a batch job a stream watches, set aside for a long interactive job
    start_worker()
    batch = jobs.submit(**LONG, temperature=0, priority="batch", abandon_on_disconnect=True)["id"]
    stream = EventStream(live_server, batch)
    for event in stream:
        if event.get("event") == "token" and event["id"] >= 3:
            break
    busy = jobs.submit("busy", max_tokens=4000, ignore_eos=True)["id"]
    wait_event(store, batch, lambda e: e.type == "requeued", timeout_s=60)
    kept = store.get(batch).usage.completion_tokens

    # When its client goes while it waits
    stream.close()

    # Then it ends cancelled (client_gone) without running again, while the interactive job still runs
    gone = wait_ended(store, batch, timeout_s=60)
    assert store.get(busy).status.value == "in_progress"
    jobs.cancel(busy)
    assert (gone["status"], gone["error"]["type"]) == ("cancelled", "client_gone")
    assert gone["usage"]["completion_tokens"] == kept
    assert [e.type for e in store.events(batch)].count("started") == 1


def test_a_set_aside_job_goes_on_exactly_after_its_worker_is_killed(jobs, store, worker_process):
    # Given the answer a batch job gives uninterrupted, on a worker process
    worker_process(ONELANE_SPECULATE_ALWAYS="true")
    whole = wait_ended(store, jobs.submit(**LONG, temperature=0, priority="batch")["id"], timeout_s=120)["output"]

    # When the same batch job is set aside for a long interactive job, and the worker is killed while it waits
    batch = jobs.submit(**LONG, temperature=0, priority="batch")["id"]
    running(store, batch, tokens=4)
    busy = jobs.submit("busy", max_tokens=4000, ignore_eos=True)["id"]
    wait_event(store, busy, lambda e: e.type == "token", timeout_s=60)
    assert store.get(batch).status.value == "queued" and preempted(store, batch)
    os.kill(wait_for_worker(store).pid, signal.SIGKILL)
    jobs.cancel(busy)  # (the batch job need not wait for it)

    # Then the next worker runs it on from its tokens: the same answer, one attempt
    done = wait_ended(store, batch, timeout_s=180)
    assert (done["status"], done["attempts"], done["usage"]["completion_tokens"]) == ("completed", 1, 600)
    assert done["output"] == whole == logged_text(store, batch)
    assert done["timings"]["accepted_tokens"] > 0
