"""Overload through the OpenAI endpoints: OpenAI's error shape, 429/503, and a Retry-After the SDK can honour."""

from __future__ import annotations

import openai
import pytest


@pytest.fixture
def settings(settings):  # type: ignore[no-untyped-def]
    users = settings.model_validate({"users": "alice:ka,bob:kb"}).users
    return settings.model_copy(update={"model": None, "users": users, "max_queue": 3, "max_queued_per_user": 2})


def sdk(live_server: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_server}/v1", api_key=key, max_retries=0, timeout=30)


def submit(jobs, key: str) -> None:  # type: ignore[no-untyped-def]
    response = jobs.client.post("/v1/jobs", json={"prompt": "x"}, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 202


def ask(client: openai.OpenAI) -> None:
    client.chat.completions.create(model="onelane-demo", messages=[{"role": "user", "content": "x"}], max_tokens=2)


def test_past_the_user_quota_is_a_rate_limit_error_with_retry_after(jobs, live_server):
    submit(jobs, "ka")
    submit(jobs, "ka")  # no worker runs: both wait
    with pytest.raises(openai.RateLimitError) as err:
        ask(sdk(live_server, "ka"))
    assert err.value.status_code == 429
    assert err.value.body["code"] == "quota_exceeded" and err.value.body["type"] == "rate_limit_error"
    assert int(err.value.response.headers["retry-after"]) >= 1


def test_past_the_global_bound_is_a_server_error_with_retry_after(jobs, live_server):
    submit(jobs, "ka")
    submit(jobs, "ka")
    submit(jobs, "kb")
    with pytest.raises(openai.InternalServerError) as err:
        ask(sdk(live_server, "kb"))
    assert err.value.status_code == 503
    assert err.value.body["code"] == "queue_full"
    assert int(err.value.response.headers["retry-after"]) >= 1


def test_a_wrong_key_is_an_authentication_error(live_server):
    with pytest.raises(openai.AuthenticationError):
        ask(sdk(live_server, "wrong"))
