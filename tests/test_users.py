"""Many users: keys and ownership, bounded admission with Retry-After, fair turns."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tasks import keys
from tests.helpers import BUSY, wait_ended, wait_event
from tests.test_stream import running_job_left_s

USERS = "alice:ka,bob:kb,carol:kc,dave:kd"


def auth(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer k{user[0]}"}


@pytest.fixture
def settings(settings):  # type: ignore[no-untyped-def]
    return settings.model_copy(
        update={"users": settings.model_validate({"users": USERS}).users, "max_queue": 50, "max_queued_per_user": 20}
    )


def submit(client, user: str, prompt: str = "x", **fields):  # type: ignore[no-untyped-def]
    return client.post(
        "/v1/jobs", json={"prompt": prompt, "max_tokens": 3, "ignore_eos": True, **fields}, headers=auth(user)
    )


def test_no_key_or_a_wrong_key_gets_401(jobs):
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic a2E="}):
        response = jobs.client.post("/v1/jobs", json={"prompt": "x"}, headers=headers)
        assert response.status_code == 401
        assert response.get_json()["error"]["type"] == "unauthorized"
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert jobs.client.get("/v1/jobs").status_code == 401


def test_another_user_cannot_see_stream_list_or_cancel_a_job(jobs, live_server, store):
    job = submit(jobs.client, "alice").get_json()
    c = jobs.client

    assert c.get(f"/v1/jobs/{job['id']}", headers=auth("bob")).status_code == 404
    assert requests.get(f"{live_server}/v1/jobs/{job['id']}/events", headers=auth("bob"), timeout=5).status_code == 404
    assert c.delete(f"/v1/jobs/{job['id']}", headers=auth("bob")).status_code == 404
    assert c.get("/v1/jobs", headers=auth("bob")).get_json()["data"] == []
    # indistinguishable from a job that does not exist
    foreign = c.get(f"/v1/jobs/{job['id']}", headers=auth("bob")).get_json()
    missing = c.get("/v1/jobs/job_nope", headers=auth("bob")).get_json()
    assert str(foreign).replace(job["id"], "ID") == str(missing).replace("job_nope", "ID")
    # and alice still sees and owns it
    assert c.get(f"/v1/jobs/{job['id']}", headers=auth("alice")).get_json()["status"] == "queued"
    assert [j["id"] for j in c.get("/v1/jobs", headers=auth("alice")).get_json()["data"]] == [job["id"]]


def test_200_concurrent_submits_never_exceed_the_bounds(live_server, store):
    # alice floods (80 submits), the three others send 40 each: 200 at once, 32 in flight
    plan = ["alice"] * 80 + ["bob", "carol", "dave"] * 40

    def post(user: str) -> tuple[str, requests.Response]:
        r = requests.post(
            f"{live_server}/v1/jobs", json={"prompt": "x", "max_tokens": 3}, headers=auth(user), timeout=30
        )
        return user, r

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(post, plan))

    accepted = Counter(user for user, r in results if r.status_code == 202)
    assert sum(accepted.values()) == 50  # the global bound, reached exactly and never passed
    assert max(accepted.values()) <= 20 and accepted["alice"] == 20
    for _user, r in results:
        if r.status_code == 202:
            continue
        error = r.json()["error"]["type"]
        assert (r.status_code, error) in {(429, "quota_exceeded"), (503, "queue_full")}, r.text
        assert r.headers["Retry-After"].isdigit() and int(r.headers["Retry-After"]) >= 1
    # alice's 60 beyond her quota are all refused (429, or 503 when the queue filled before her quota was looked at)
    assert sum(1 for user, r in results if user == "alice" and r.status_code != 202) == 60
    # rejected submissions left nothing behind
    assert store.redis.zcard(keys.WAITING) == 50
    assert len(store.redis.keys(keys.JOB_PREFIX + "*")) == 50


def test_retry_after_follows_the_eta(jobs, store, start_worker, settings):
    start_worker()
    c = jobs.client
    warm = [wait_ended(store, submit(c, "bob", max_tokens=20).get_json()["id"]) for _ in range(2)]
    mean = sum(w["timings"]["finished_at"] - w["timings"]["started_at"] for w in warm) / 2
    long = submit(c, "carol", max_tokens=4000).get_json()["id"]  # runs long
    store.follow_live(store.get(long))  # followed as it runs (else its count is written once a second)
    # its token rate is measured well once it has run a while
    wait_event(store, long, lambda e: e.type == "token" and store.get(long).usage.completion_tokens >= 300)
    admitted = [submit(c, "alice") for _ in range(20)]
    assert {r.status_code for r in admitted} == {202}

    over = submit(c, "alice")
    first = c.get(f"/v1/jobs/{admitted[0].get_json()['id']}", headers=auth("alice")).get_json()
    left = running_job_left_s(store, long)

    assert over.status_code == 429
    # alice's first waiting job has nobody ahead: it starts when the long job ends, whatever the short jobs took.
    # Retry-After is that job's ETA, as the same forecast gives it (its accuracy is test_eta.py's); and it is the long
    # job's end, not a queue's worth of short jobs: near what the long job has left at its measured rate (within a
    # factor of 3: on a loaded machine the worker's pace, fitted over its steps, and this rate part by seconds)
    retry_after = int(over.headers["Retry-After"])
    assert retry_after == pytest.approx(first["eta_s"], abs=1.5)
    assert left / 3 - 1 <= retry_after <= 3 * left + 1
    assert retry_after > 2 * mean
    assert c.delete(f"/v1/jobs/{long}", headers=auth("carol")).status_code == 200  # (the worker stops without a drain)


def test_a_user_quota_from_the_keys_file_applies(jobs, tmp_path, settings, make_app):
    from tasks.settings import Settings

    keys_file = tmp_path / "keys.toml"
    keys_file.write_text('[users.erin]\nkey = "ke"\nmax_queued = 2\n')
    env = {"REDIS_URL": settings.effective_redis_url, "ONELANE_API_KEYS_FILE": str(keys_file)}
    client = make_app(Settings.from_env(env)).test_client()

    assert [submit(client, "erin").status_code for _ in range(3)] == [202, 202, 429]


def test_a_flood_from_one_user_delays_another_by_at_most_one_job(jobs, store, start_worker):
    c = jobs.client
    flood = [submit(c, "alice", f"a{n}").get_json()["id"] for n in range(10)]
    single = submit(c, "bob", "b").get_json()["id"]

    start_worker()
    done = {job_id: wait_ended(store, job_id) for job_id in [*flood, single]}

    order = sorted(done, key=lambda job_id: done[job_id]["timings"]["started_at"])
    assert order.index(single) <= 1  # runs no later than second
    assert [j for j in order if j != single] == flood  # FIFO within alice


def test_three_users_interleave(jobs, store, start_worker):
    c = jobs.client
    ids = {
        user: [submit(c, user, f"{user}{n}").get_json()["id"] for n in range(5)] for user in ("alice", "bob", "carol")
    }
    owner = {job_id: user for user, job_ids in ids.items() for job_id in job_ids}

    start_worker()
    done = {job_id: wait_ended(store, job_id) for job_id in owner}

    order = sorted(done, key=lambda job_id: done[job_id]["timings"]["started_at"])
    assert [owner[j][0] for j in order] == list("abc" * 5)


def test_positions_reported_match_the_order_jobs_run(jobs, store, start_worker):
    c = jobs.client
    plan = ["alice"] * 4 + ["bob"] * 2 + ["carol"] + ["alice"] + ["dave"] * 2
    ids = [submit(c, user).get_json()["id"] for user in plan]
    reported = {
        job_id: c.get(f"/v1/jobs/{job_id}", headers=auth(user)).get_json()["position"]
        for job_id, user in zip(ids, plan)
    }

    start_worker()
    done = {job_id: wait_ended(store, job_id) for job_id in ids}

    order = sorted(ids, key=lambda job_id: done[job_id]["timings"]["started_at"])
    assert [reported[j] for j in order] == list(range(1, len(ids) + 1))


def test_jobs_skipped_because_their_client_left_cost_their_owner_no_future_turns(jobs, store, start_worker):
    c = jobs.client
    start_worker()
    busy = submit(c, "carol", "busy", max_tokens=BUSY).get_json()["id"]
    wait_event(store, busy, lambda e: e.type == "token")
    abandoned = [submit(c, "alice", f"a{n}", abandon_on_disconnect=True).get_json()["id"] for n in range(10)]
    # nobody watches them: once the grace passes they end, skipped, while the busy job still runs
    assert {wait_ended(store, job_id)["error"]["type"] for job_id in abandoned} == {"client_gone"}
    assert store.get(busy).status.value == "in_progress"

    for n in range(5):
        assert submit(c, "bob", f"b{n}").status_code == 202
    back = submit(c, "alice", "back").get_json()

    assert back["position"] <= 2  # at most one of bob's jobs ahead, as for any user
    c.delete(f"/v1/jobs/{busy}", headers=auth("carol"))
