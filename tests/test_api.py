"""The REST edge: every bad input gets its status and a JSON error, and leaves nothing behind."""

from __future__ import annotations

import pytest

from tasks import keys

LIMITS = {"max_prompt_chars": 32_000, "max_tokens_limit": 4096}

BAD_BODIES = [
    ("malformed json", b'{"prompt": "hi"', 400, "invalid_json"),
    ("not an object", b'["hi"]', 400, "invalid_json"),
    ("empty body", b"", 400, "invalid_json"),
    ("neither prompt nor messages", b'{"max_tokens": 4}', 422, "invalid_request"),
    ("both prompt and messages", b'{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}', 422,
     "invalid_request"),
    ("prompt of the wrong type", b'{"prompt": 42}', 422, "invalid_request"),
    ("max_tokens as a string", b'{"prompt": "a", "max_tokens": "8"}', 422, "invalid_request"),
    ("max_tokens zero", b'{"prompt": "a", "max_tokens": 0}', 422, "invalid_request"),
    ("max_tokens above the limit", b'{"prompt": "a", "max_tokens": 4097}', 422, "invalid_request"),
    ("negative temperature", b'{"prompt": "a", "temperature": -1}', 422, "invalid_request"),
    ("top_p zero", b'{"prompt": "a", "top_p": 0}', 422, "invalid_request"),
    ("boolean seed", b'{"prompt": "a", "seed": true}', 422, "invalid_request"),
    ("unknown field", b'{"prompt": "a", "n": 2}', 422, "invalid_request"),
    ("empty stop string", b'{"prompt": "a", "stop": [""]}', 422, "invalid_request"),
    ("unknown role", b'{"messages": [{"role": "wizard", "content": "x"}]}', 422, "invalid_request"),
    ("empty messages", b'{"messages": []}', 422, "invalid_request"),
    ("ttl beyond the server maximum", b'{"prompt": "a", "ttl_s": 100000}', 422, "invalid_request"),
    ("negative ttl", b'{"prompt": "a", "ttl_s": -1}', 422, "invalid_request"),
    ("prompt too large", b'{"prompt": "' + b"x" * 32_001 + b'"}', 413, "prompt_too_large"),
    ("body too large", b'{"prompt": "' + b"x" * 300_000 + b'"}', 413, "payload_too_large"),
]  # fmt: skip


@pytest.mark.parametrize("name,body,status,error_type", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_submission_gets_a_json_error_and_admits_nothing(jobs, store, name, body, status, error_type):
    response = jobs.client.post("/v1/jobs", data=body, content_type="application/json")

    assert response.status_code == status
    error = response.get_json()["error"]
    assert error["type"] == error_type
    assert error["message"] and "Traceback" not in error["message"]
    assert store.redis.keys(keys.NS + "*") == []


def test_unknown_job_is_404_for_get_and_cancel(jobs):
    for response in (jobs.client.get("/v1/jobs/job_nope"), jobs.client.delete("/v1/jobs/job_nope")):
        assert response.status_code == 404
        assert response.get_json()["error"]["type"] == "not_found"


def test_unknown_route_and_wrong_method_are_json(jobs):
    assert jobs.client.get("/v2/nothing").get_json()["error"]["type"] == "not_found"
    response = jobs.client.put("/v1/jobs")
    assert response.status_code == 405 and response.get_json()["error"]["type"] == "method_not_allowed"


def test_submit_returns_202_with_location_and_position(jobs):
    first = jobs.client.post("/v1/jobs", json={"prompt": "a", "max_tokens": 4})
    second = jobs.submit("b", max_tokens=4)

    assert first.status_code == 202
    assert first.headers["Location"] == f"/v1/jobs/{first.get_json()['id']}"
    assert first.get_json()["position"] == 1
    assert second["position"] == 2
    assert second["id"] != first.get_json()["id"] and len(second["id"]) >= 20


def test_list_returns_the_callers_jobs_newest_first(jobs):
    ids = [jobs.submit(f"p{n}", max_tokens=4)["id"] for n in range(3)]
    listed = jobs.client.get("/v1/jobs").get_json()["data"]
    assert [j["id"] for j in listed] == ids[::-1]


def test_defaults_apply_when_options_are_omitted(jobs, settings):
    job = jobs.submit("a")
    assert job["params"]["max_tokens"] == settings.default_max_tokens
    assert job["deadline"] == pytest.approx(job["timings"]["queued_at"] + settings.job_ttl_s, abs=0.01)


def test_stop_accepts_a_string_or_a_list(jobs):
    assert jobs.submit("a", stop="x")["params"]["stop"] == ["x"]
    assert jobs.submit("a", stop=["x", "yz"])["params"]["stop"] == ["x", "yz"]


def test_redis_down_gives_503_json(make_app, redis_server):
    from tasks.settings import Settings

    dead = make_app(Settings(redis_url="redis://127.0.0.1:1", model="m"))
    response = dead.test_client().post("/v1/jobs", json={"prompt": "a"})
    assert response.status_code == 503
    assert response.get_json()["error"]["type"] == "unavailable"
    assert response.headers["Retry-After"]


def test_healthz(jobs):
    assert jobs.client.get("/healthz").get_json() == {"status": "ok"}
