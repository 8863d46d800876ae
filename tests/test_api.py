"""The REST edge: every bad input gets its status and a JSON error, and leaves nothing behind."""

from __future__ import annotations

import json

import pytest

from tasks import keys
from tests.helpers import JobsClient

BAD_BODIES = [
    ("malformed json", b'{"prompt": "hi"', 400, "invalid_json"),
    ("not an object", b'["hi"]', 400, "invalid_json"),
    ("empty body", b"", 400, "invalid_json"),
    ("neither prompt nor messages", b'{"max_tokens": 4}', 422, "invalid_request"),
    (
        "both prompt and messages",
        b'{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}',
        422,
        "invalid_request",
    ),
    ("prompt of the wrong type", b'{"prompt": 42}', 422, "invalid_request"),
    ("max_tokens as a string", b'{"prompt": "a", "max_tokens": "8"}', 422, "invalid_request"),
    ("max_tokens zero", b'{"prompt": "a", "max_tokens": 0}', 422, "invalid_request"),
    ("max_tokens above the limit", b'{"prompt": "a", "max_tokens": 1000001}', 422, "invalid_request"),
    ("negative temperature", b'{"prompt": "a", "temperature": -1}', 422, "invalid_request"),
    ("top_p zero", b'{"prompt": "a", "top_p": 0}', 422, "invalid_request"),
    ("boolean seed", b'{"prompt": "a", "seed": true}', 422, "invalid_request"),
    ("unknown field", b'{"prompt": "a", "n": 2}', 422, "invalid_request"),
    ("empty stop string", b'{"prompt": "a", "stop": [""]}', 422, "invalid_request"),
    ("unknown role", b'{"messages": [{"role": "wizard", "content": "x"}]}', 422, "invalid_request"),
    ("empty messages", b'{"messages": []}', 422, "invalid_request"),
    ("ttl beyond the server maximum", b'{"prompt": "a", "ttl_s": 100000}', 422, "invalid_request"),
    ("negative ttl", b'{"prompt": "a", "ttl_s": -1}', 422, "invalid_request"),
    ("prompt too large", b'{"prompt": "' + b"x" * 200_001 + b'"}', 413, "prompt_too_large"),
    ("lone surrogate in the prompt", b'{"prompt": "a\\ud800b"}', 400, "invalid_json"),
    ("lone low surrogate in the prompt", b'{"prompt": "\\udc00"}', 400, "invalid_json"),
    ("lone surrogate in a message", b'{"messages": [{"role": "user", "content": "\\ud83d"}]}', 400, "invalid_json"),
    ("lone surrogate in a stop string", b'{"prompt": "a", "stop": ["\\ud800"]}', 400, "invalid_json"),
    ("lone surrogate in a key", b'{"prompt": "a", "\\ud800": 1}', 400, "invalid_json"),
    ("surrogate as raw bytes", b'{"prompt": "\xed\xa0\x80"}', 400, "invalid_json"),
    ("nested 100,000 deep", b"[" * 100_000, 400, "invalid_json"),
    (
        "nested deep inside an object",
        b'{"prompt": "a", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        400,
        "invalid_json",
    ),
    ("NaN is not JSON", b'{"prompt": "a", "temperature": NaN}', 400, "invalid_json"),
    ("an integer beyond any float", b'{"prompt": "a", "temperature": 1' + b"0" * 400 + b"}", 422, "invalid_request"),
    ("empty prompt", b'{"prompt": ""}', 422, "invalid_request"),
    (
        "every message empty",
        b'{"messages": [{"role": "system", "content": ""}, {"role": "user", "content": ""}]}',
        422,
        "invalid_request",
    ),
    ("body too large", b'{"prompt": "' + b"x" * 2_500_000 + b'"}', 413, "payload_too_large"),
]


@pytest.mark.parametrize("name,body,status,error_type", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_submission_gets_a_json_error_and_admits_nothing(jobs, store, name, body, status, error_type):
    response = jobs.client.post("/v1/jobs", data=body, content_type="application/json")

    assert response.status_code == status
    error = response.get_json()["error"]
    assert error["type"] == error_type
    assert error["message"] and "Traceback" not in error["message"]
    assert store.redis.keys(keys.NS + "*") == []


@pytest.mark.parametrize(
    "body,param", [({"prompt": ""}, "prompt"), ({"messages": [{"role": "user", "content": ""}]}, "messages")]
)
def test_an_empty_prompt_is_refused_at_the_door_by_name(jobs, store, body, param):
    response = jobs.client.post("/v1/jobs", json=body)

    assert response.status_code == 422
    assert response.get_json()["error"]["param"] == param
    assert store.redis.keys(keys.NS + "*") == []


def test_a_message_may_be_empty_when_another_is_not(jobs):
    messages = [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}]
    assert jobs.submit(messages=messages, prompt=None)["messages"] == messages


def test_a_prompt_of_the_most_characters_as_json_escapes_is_accepted(make_app, settings):
    # (a KV budget that holds its tokens, four an emoji: the body's bound is the story here, not the model's)
    jobs = JobsClient(
        make_app(settings.model_copy(update={"kv_budget_tokens": 5 * settings.max_prompt_chars})).test_client()
    )
    emoji = "\U0001f600"  # JSON writes it as a 12-byte escape, "\\ud83d\\ude00"
    body = json.dumps({"prompt": emoji * settings.max_prompt_chars, "stop": ["\U0001f4a9" * 256] * 8})

    response = jobs.client.post("/v1/jobs", data=body, content_type="application/json")

    assert response.status_code == 202, response.get_json()
    assert response.get_json()["prompt"] == emoji * settings.max_prompt_chars


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


@pytest.mark.parametrize(
    "query",
    [
        "limit=abc",
        "limit=1e3",
        "limit=-5",
        "limit=0",
        "limit=201",
        "limit=100000",
        "limit=",
        "limit=+5",
        "limit=%205",
        "limit=2.0",
        "limit=" + "9" * 5000,
        "limit=5&limit=6",
    ],
)
def test_a_malformed_or_out_of_range_limit_is_400_naming_the_range(jobs, query):
    jobs.submit("p", max_tokens=4)
    response = jobs.client.get(f"/v1/jobs?{query}")
    assert response.status_code == 400, response.get_json()
    error = response.get_json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request", "limit")
    assert "1 to 200" in error["message"]


def test_a_limit_within_range_lists_that_many(jobs):
    ids = [jobs.submit(f"p{n}", max_tokens=4)["id"] for n in range(3)]
    for query, expected in [("limit=1", ids[-1:]), ("limit=002", ids[:0:-1]), ("limit=200", ids[::-1])]:
        assert [j["id"] for j in jobs.client.get(f"/v1/jobs?{query}").get_json()["data"]] == expected


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
