"""Health reflects real progress; metrics move as jobs pass."""

from __future__ import annotations

import time

from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from tasks import keys
from tasks.job import JobStatus
from tests.helpers import claim_now, wait_ended


def scrape(client) -> dict[str, float]:  # type: ignore[no-untyped-def]
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == CONTENT_TYPE_LATEST  # its charset once
    samples = {}
    for family in text_string_to_metric_families(response.get_data(as_text=True)):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def test_readyz_needs_a_live_worker(jobs, start_worker):
    not_ready = jobs.client.get("/readyz")
    assert not_ready.status_code == 503
    assert "no worker" in not_ready.get_json()["error"]["message"]

    start_worker()
    ready = jobs.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.get_json()["workers"][0]["heartbeat_age_s"] < 3


def test_metrics_move_as_jobs_pass(jobs, store, start_worker):
    before = scrape(jobs.client)
    assert before["onelane_jobs_admitted_total"] == 0

    start_worker()
    done = [jobs.submit(f"m{n}", max_tokens=5, ignore_eos=True) for n in range(3)]
    cancelled = jobs.submit("c", max_tokens=5, ttl_s=600)
    for job in done:
        wait_ended(store, job["id"])
    jobs.cancel(cancelled["id"])

    after = scrape(jobs.client)
    assert after["onelane_jobs_admitted_total"] == 4
    assert after["onelane_jobs_finished_total{status=completed}"] >= 3
    assert after["onelane_tokens_generated_total"] >= 15
    assert after["onelane_queue_wait_seconds_count"] >= 3
    assert after["onelane_time_to_first_token_seconds_count"] >= 3
    assert after["onelane_job_duration_seconds_count"] >= 3
    assert after["onelane_workers_alive"] == 1
    assert after["onelane_queue_depth"] == 0


def test_a_wait_and_a_run_near_their_limits_count_in_buckets_of_their_own(jobs, store, settings):
    # Given a job that waited 590 s (ONELANE_JOB_TTL is 600) and then ran 800 s (ONELANE_JOB_TIME_LIMIT is 900)
    job_id = jobs.submit("long", max_tokens=4)["id"]
    store.redis.hincrbyfloat(keys.job(job_id), "queued_at", -590)
    assert store.for_worker("w1").take_device() == "ok"
    assert claim_now(store, "w1").id == job_id
    store.redis.hincrbyfloat(keys.job(job_id), "started_at", -800)

    # When it ends
    assert store.for_worker("w1").finish(job_id, JobStatus.COMPLETED, completion_tokens=4)

    # Then each lands in the bucket just above it, not in +Inf; and the histogram that saw nothing has every bucket
    metrics = scrape(jobs.client)
    wait, run, first = "onelane_queue_wait_seconds", "onelane_job_duration_seconds", "onelane_time_to_first_token"
    assert [metrics[f"{wait}_bucket{{le={le}}}"] for le in ("300", "600", "+Inf")] == [0, 1, 1]
    assert [metrics[f"{run}_bucket{{le={le}}}"] for le in ("600", "900", "+Inf")] == [0, 1, 1]
    assert [metrics[f"{first}_seconds_bucket{{le={le}}}"] for le in ("0.005", "900", "+Inf")] == [0, 0, 0]


def test_rejections_are_counted_by_reason(jobs, store, settings, make_app):
    client = make_app(settings.model_copy(update={"max_queue": 1})).test_client()
    assert client.post("/v1/jobs", json={"prompt": "a"}).status_code == 202
    assert client.post("/v1/jobs", json={"prompt": "b"}).status_code == 503
    assert scrape(client)["onelane_jobs_rejected_total{reason=queue_full}"] == 1


def test_readyz_forgets_a_job_that_ended_stalled_while_its_worker_holds_the_device(settings, make_app, store):
    client = make_app(settings.model_copy(update={"stall_s": 0.3})).test_client()
    quick = store.__class__(store.redis, settings.model_copy(update={"stall_s": 0.3}))
    job = client.post("/v1/jobs", json={"prompt": "stuck", "max_tokens": 4}).get_json()
    assert quick.for_worker("w1").take_device() == "ok" and claim_now(quick, "w1").id == job["id"]
    assert client.get("/readyz").get_json()["workers"][0]["running"] == 1

    while not (stalled := quick.upkeep.watch_device()[1]):  # the supervisor's look, until the job counts as stalled
        assert quick.get(job["id"]).status.value == "in_progress"
    assert stalled == [job["id"]] and quick.get(job["id"]).status.value == "failed"
    assert quick.for_worker("w1").take_device() == "ok"  # its worker still holds the device (say, not killed yet)

    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.get_json()["workers"][0]["running"] == 0


def test_readyz_counts_each_workers_jobs_and_never_names_them(settings, make_app, store):
    # Given API keys, and alice's job running on a worker that stopped making progress
    from tasks.users import User

    keyed = settings.model_copy(update={"users": (User(name="alice", key="ka"),), "stall_s": 1.0})
    client = make_app(keyed).test_client()
    job = client.post("/v1/jobs", json={"prompt": "a", "max_tokens": 4}, headers={"Authorization": "Bearer ka"})
    job_id = job.get_json()["id"]
    assert store.for_worker("w1").take_device() == "ok" and claim_now(store, "w1").id == job_id

    # When anybody asks /readyz, ready and then once the worker has stalled (asked again until it tells so)
    ready = client.get("/readyz")
    deadline = time.monotonic() + 30
    stalled = client.get("/readyz")
    while stalled.status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.05)  # a poll: a stall is the absence of progress, announced nowhere
        stalled = client.get("/readyz")

    # Then each worker shows how many jobs it runs, never which
    assert ready.status_code == 200 and ready.get_json()["workers"][0]["running"] == 1
    assert stalled.status_code == 503 and stalled.get_json()["workers"][0]["running"] == 1
    for answer in (ready, stalled):
        assert job_id not in answer.get_data(as_text=True) and "jobs" not in answer.get_json()["workers"][0]
