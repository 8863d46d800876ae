"""A request of several answers (`n`, `best_of`) is admitted as one: all its jobs or none, in one step. A refused
one leaves nothing behind (no job listed, none counted in /metrics), and its message says what was refused."""

from __future__ import annotations

import re
from typing import Any

import pytest

ALICE, BOB = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def settings(settings):  # type: ignore[no-untyped-def]
    # no worker runs: every admitted job waits
    users = settings.model_validate({"users": "alice:ka,bob:kb"}).users
    return settings.model_copy(update={"users": users, "max_queue": 6, "max_queued_per_user": 4})


@pytest.fixture
def client(app):  # type: ignore[no-untyped-def]
    return app.test_client()


def metric(client, name: str) -> float:  # type: ignore[no-untyped-def]
    text = client.get("/metrics").get_data(as_text=True)
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert match, name
    return float(match.group(1))


def listed(client) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(job["id"] for job in client.get("/v1/jobs", headers=ALICE).get_json()["data"])


def submit(client, headers: dict[str, str], model: str) -> str:  # type: ignore[no-untyped-def]
    response = client.post("/v1/jobs", json={"prompt": "x", "model": model}, headers=headers)
    assert response.status_code == 202, response.get_json()
    return str(response.get_json()["id"])


def chat(client, model: str, n: int, **fields: Any):  # type: ignore[no-untyped-def]
    body = {"model": model, "messages": HI, "n": n, "max_tokens": 4, **fields}
    return client.post("/v1/chat/completions", json=body, headers=ALICE, buffered=False)


def test_more_answers_than_the_quota_allows_is_refused_by_name_and_leaves_nothing(client, model):
    # Given a quota of 4 waiting jobs, none waiting
    # When a completion asks for the best of 5 answers
    body = {"model": model, "prompt": "Once", "best_of": 5, "max_tokens": 4}
    refused = client.post("/v1/completions", json=body, headers=ALICE)

    # Then it is refused as a request that can never be admitted, naming the field, and saying why
    error = refused.get_json()["error"]
    assert refused.status_code == 400 and error["param"] == "best_of", error
    assert "5 answers" in error["message"] and "4 waiting jobs" in error["message"], error["message"]
    # and nothing of it remains: no job listed, none counted as admitted or cancelled
    assert listed(client) == []
    assert metric(client, "onelane_jobs_admitted_total") == 0
    assert metric(client, 'onelane_jobs_finished_total{status="cancelled"}') == 0

    # (and so for chat's n)
    refused = chat(client, model, 5)
    assert refused.status_code == 400 and refused.get_json()["error"]["param"] == "n"


def test_answers_that_do_not_fit_beside_the_owners_waiting_jobs_are_none_admitted_and_it_says_so(client, model):
    # Given two of the caller's jobs waiting, under a quota of 4
    waiting = sorted(submit(client, ALICE, model) for _ in range(2))

    # When a chat asks for 3 answers (5 waiting jobs: one too many)
    refused = chat(client, model, 3)

    # Then it is refused as one, its message true ("2 waiting", not "4 already waiting")
    error = refused.get_json()["error"]
    assert refused.status_code == 429 and error["code"] == "quota_exceeded", error
    assert "2 jobs waiting" in error["message"] and "3 answers" in error["message"], error["message"]
    assert int(refused.headers["Retry-After"]) >= 1
    # and none of its jobs was ever admitted: only the two earlier ones are listed, and counted
    assert listed(client) == waiting
    assert metric(client, "onelane_jobs_admitted_total") == 2
    assert metric(client, 'onelane_jobs_finished_total{status="cancelled"}') == 0

    # While 2 answers fit, and are admitted together
    admitted = chat(client, model, 2, stream=True)
    assert admitted.status_code == 200
    ids = admitted.headers["x-onelane-job-ids"].split(",")
    admitted.close()
    assert listed(client) == sorted([*waiting, *ids])


def test_answers_that_do_not_fit_the_queue_are_none_admitted(client, model):
    # Given the queue (6 places) holding 5 jobs: 4 of another caller's, 1 of this caller's
    for _ in range(4):
        submit(client, BOB, model)
    mine = submit(client, ALICE, model)

    # When a chat asks for 2 answers
    refused = chat(client, model, 2)

    # Then it is refused as one (the queue has room for one job, not two), and none of its jobs remains
    error = refused.get_json()["error"]
    assert refused.status_code == 503 and error["code"] == "queue_full", error
    assert "2 answers" in error["message"], error["message"]
    assert listed(client) == [mine]
    assert metric(client, "onelane_jobs_admitted_total") == 5
