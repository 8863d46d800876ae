"""Several models and two priority classes, as the web sees them: every way in names a served model (or gets the
default) and a class (or gets the caller's own); an unknown model is a 404 that admits nothing."""

from __future__ import annotations

import re
import threading
import time

import pytest

from tasks import keys
from tasks.catalogue import ModelConfig
from tasks.users import User
from tests.test_pages import post_form, submit_via_form

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def settings(settings, demo_model):  # type: ignore[no-untyped-def]
    tiny, other = (
        ModelConfig(name="tiny", path=str(demo_model), default=True),
        ModelConfig(name="other", path=str(demo_model)),
    )
    return settings.model_copy(update={"model": None, "models": (tiny, other)})


@pytest.fixture
def client(app):  # type: ignore[no-untyped-def]
    return app.test_client()


def open_stream(client, path: str, body: dict[str, object]):  # type: ignore[no-untyped-def]
    """An OpenAI request that streams: admitted at once, nothing waits for a worker (close it to leave)."""
    response = client.post(path, json={**body, "stream": True})
    assert response.status_code == 200, response.get_data(as_text=True)
    return response


def test_the_models_endpoint_lists_the_catalog(client):
    listed = client.get("/v1/models").get_json()["data"]

    assert [m["id"] for m in listed] == ["tiny", "other"]
    assert all(m["object"] == "model" and m["owned_by"] == "onelane" for m in listed)


def test_a_job_runs_on_the_model_it_names_or_on_the_default(client):
    named = client.post("/v1/jobs", json={"prompt": "x", "model": "other"})
    unnamed = client.post("/v1/jobs", json={"prompt": "x"})

    assert named.status_code == 202 and named.get_json()["model"] == "other"
    assert unnamed.get_json()["model"] == "tiny"
    assert client.get(f"/v1/jobs/{named.get_json()['id']}").get_json()["model"] == "other"


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/jobs", {"prompt": "x"}),
        ("/v1/chat/completions", CHAT),
        ("/v1/completions", {"prompt": "x"}),
    ],
)
def test_an_unknown_model_is_404_naming_the_served_ones_and_admits_nothing(client, store, path, body):
    response = client.post(path, json={**body, "model": "gpt-4o"})

    assert response.status_code == 404
    error = response.get_json()["error"]
    assert error.get("code", error.get("type")) == "model_not_found" and error["param"] == "model"
    assert "'tiny', 'other'" in error["message"]
    assert store.redis.keys(keys.NS + "*") == []


def test_the_openai_endpoints_run_any_served_model(client, store):
    response = open_stream(client, "/v1/chat/completions", {**CHAT, "model": "other"})

    assert store.get(response.headers["x-onelane-job-id"]).spec.model == "other"
    response.close()


def test_a_job_may_ask_for_the_batch_class(client):
    job = client.post("/v1/jobs", json={"prompt": "x", "priority": "batch"}).get_json()

    assert job["priority"] == "batch"
    assert client.get(f"/v1/jobs/{job['id']}").get_json()["priority"] == "batch"
    assert client.post("/v1/jobs", json={"prompt": "x"}).get_json()["priority"] == "interactive"


@pytest.mark.parametrize("priority", ["urgent", "", "Batch", 1, True, ["batch"]])
def test_a_priority_that_is_not_a_class_is_refused_by_name(client, store, priority):
    response = client.post("/v1/jobs", json={"prompt": "x", "priority": priority})

    assert response.status_code == 422  # as every other field of /v1/jobs with a value out of its range
    assert response.get_json()["error"]["param"] == "priority"
    assert store.redis.keys(keys.NS + "*") == []


@pytest.mark.parametrize(
    "tier,priority,echoed",
    [
        ("flex", "batch", "flex"),
        ("priority", "interactive", "priority"),
        ("auto", "interactive", "default"),
        ("default", "interactive", "default"),
        (None, "interactive", "default"),
    ],
)
def test_openai_service_tiers_are_priority_classes(client, store, tier, priority, echoed):
    body = {**CHAT, "model": "tiny"} | ({"service_tier": tier} if tier else {})

    response = open_stream(client, "/v1/chat/completions", body)

    assert store.get(response.headers["x-onelane-job-id"]).spec.priority == priority
    first = next(iter(response.response))  # the role chunk, sent before any token
    assert f'"service_tier":"{echoed}"' in (first if isinstance(first, str) else first.decode())
    response.close()


@pytest.mark.parametrize("path,body", [("/v1/chat/completions", CHAT), ("/v1/completions", {"prompt": "x"})])
@pytest.mark.parametrize("tier", ["scale", "", "FLEX", 1, True, {"tier": "flex"}])
def test_an_unknown_service_tier_is_a_bad_request_naming_it(client, store, path, body, tier):
    response = client.post(path, json={**body, "model": "tiny", "service_tier": tier})

    assert response.status_code == 400
    error = response.get_json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "service_tier"
    assert store.redis.keys(keys.NS + "*") == []


@pytest.mark.parametrize("model", [1, True, ["tiny"], {"name": "tiny"}, ""])
def test_a_model_that_is_not_a_served_name_is_a_client_error(client, store, model):
    for path, body in (("/v1/jobs", {"prompt": "x"}), ("/v1/chat/completions", CHAT)):
        response = client.post(path, json={**body, "model": model})
        assert 400 <= response.status_code < 500 and response.get_json()["error"]["param"] == "model"
    assert store.redis.keys(keys.NS + "*") == []


def test_a_model_that_failed_to_load_is_503_with_retry_after_until_it_is_tried_again(client, store):
    store.for_worker("w").model_failed(
        "other", "the model failed to load (its files were not found)"
    )  # as a worker records it

    for path, body in (("/v1/jobs", {"prompt": "x"}), ("/v1/chat/completions", CHAT)):
        response = client.post(path, json={**body, "model": "other"})
        assert response.status_code == 503
        assert 0 < int(response.headers["Retry-After"]) <= store.settings.model_retry_s
        error = response.get_json()["error"]
        assert error.get("code", error.get("type")) == "model_unavailable"
        assert "files were not found" in error["message"]
    assert client.post("/v1/jobs", json={"prompt": "x", "model": "tiny"}).status_code == 202  # the others are fine


# --- the form -------------------------------------------------------------------------------------------------


def selected(html: str, name: str) -> tuple[list[str], list[str]]:
    """A <select>'s option values, and the selected ones."""
    select = re.search(rf'<select id="{name}" name="{name}"[^>]*>(.*?)</select>', html, re.S)
    assert select, html
    options = re.findall(r'<option value="([^"]*)"\s*(selected)?', select.group(1))
    return [value for value, _ in options], [value for value, chosen in options if chosen]


def test_the_form_offers_every_model_and_both_classes_with_the_defaults_chosen(client):
    html = client.get("/").get_data(as_text=True)

    assert selected(html, "model") == (["tiny", "other"], ["tiny"])
    assert selected(html, "priority") == (["interactive", "batch"], ["interactive"])


def test_the_form_submits_the_chosen_model_and_class_and_the_pages_show_them(client):
    job_id = submit_via_form(client, "hello", model="other", priority="batch")

    job = client.get(f"/v1/jobs/{job_id}").get_json()
    assert (job["model"], job["priority"]) == ("other", "batch")
    page = client.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert '<dd id="model">other</dd>' in page and '<dd id="priority">batch</dd>' in page
    listing = client.get("/jobs").get_data(as_text=True)
    assert '<td class="model">other</td>' in listing and '<td class="priority">batch</td>' in listing


def test_a_refused_form_keeps_the_chosen_model_and_class(client, store):
    response = post_form(client, prompt="", model="other", priority="batch")

    html = response.get_data(as_text=True)
    assert response.status_code == 422
    assert selected(html, "model")[1] == ["other"] and selected(html, "priority")[1] == ["batch"]
    assert store.redis.keys(keys.JOB_PREFIX + "*") == []


def test_a_form_naming_an_unknown_model_is_404_and_shows_the_form(client, store):
    response = post_form(client, prompt="x", model="gpt-4o")

    assert response.status_code == 404 and response.mimetype == "text/html"
    assert "does not exist" in response.get_data(as_text=True)
    assert store.redis.keys(keys.JOB_PREFIX + "*") == []


# --- a user whose jobs are batch unless they say otherwise ------------------------------------------------------


@pytest.fixture
def keyed(settings, make_app):  # type: ignore[no-untyped-def]
    users = (User(name="night", key="kn", priority="batch"), User(name="day", key="kd"))
    return make_app(settings.model_copy(update={"users": users})).test_client()


def test_a_batch_key_submits_batch_jobs_only_and_others_may_choose(keyed, store):
    night, day = {"Authorization": "Bearer kn"}, {"Authorization": "Bearer kd"}

    assert keyed.post("/v1/jobs", json={"prompt": "x"}, headers=night).get_json()["priority"] == "batch"
    asked = keyed.post("/v1/jobs", json={"prompt": "x", "priority": "interactive"}, headers=night)
    assert asked.status_code == 403 and asked.get_json()["error"]["param"] == "priority"
    assert keyed.post("/v1/jobs", json={"prompt": "x"}, headers=day).get_json()["priority"] == "interactive"
    assert (
        keyed.post("/v1/jobs", json={"prompt": "x", "priority": "batch"}, headers=day).get_json()["priority"] == "batch"
    )
    assert len(store.list("night")) == 1


def test_a_batch_keys_openai_requests_are_batch_and_it_cannot_ask_for_priority(keyed, store):
    night = {"Authorization": "Bearer kn"}
    for tier in ("auto", None, "flex"):
        body = {"model": "tiny", "prompt": "x", "stream": True} | ({"service_tier": tier} if tier else {})
        response = keyed.post("/v1/completions", json=body, headers=night)
        assert response.status_code == 200
        assert store.get(response.headers["x-onelane-job-id"]).spec.priority == "batch"
        response.close()
    refused = keyed.post(
        "/v1/completions", json={"model": "tiny", "prompt": "x", "service_tier": "priority"}, headers=night
    )
    assert refused.status_code == 403


def test_a_batch_users_form_starts_on_batch(keyed):
    login = keyed.get("/login").get_data(as_text=True)
    token = login.split('name="csrf_token" value="')[1].split('"')[0]
    assert keyed.post("/login", data={"key": "kn", "csrf_token": token}).status_code == 303

    html = keyed.get("/").get_data(as_text=True)

    assert selected(html, "priority")[1] == ["batch"]
    job_id = submit_via_form(keyed, "tonight")
    assert keyed.get(f"/v1/jobs/{job_id}", headers={"Authorization": "Bearer kn"}).get_json()["priority"] == "batch"


def test_a_request_waiting_when_its_model_fails_to_load_is_told_503_naming_the_model(client, store):
    # Given a chat completion waiting for "other", whose load then fails on the worker
    answer: dict[str, object] = {}
    asking = threading.Thread(target=lambda: answer.update(response=client.post("/v1/chat/completions", json={**CHAT, "model": "other"})))  # fmt: skip
    asking.start()
    deadline = time.monotonic() + 30
    while store.readings.waiting() == 0:  # (a poll: admission announces nothing to a bystander)
        assert time.monotonic() < deadline and asking.is_alive(), "the request was never admitted"
        time.sleep(0.01)
    store.for_worker("w").model_failed("other", "the model failed to load: its architecture is not supported")

    # Then the client is told as admission tells the next one: 503 with Retry-After, naming the model and why
    asking.join(30)
    response = answer["response"]
    assert response.status_code == 503  # type: ignore[attr-defined]
    assert 0 < int(response.headers["Retry-After"]) <= store.settings.model_retry_s  # type: ignore[attr-defined]
    error = response.get_json()["error"]  # type: ignore[attr-defined]
    assert error["code"] == "model_unavailable" and error["type"] == "server_error"
    assert "'other'" in error["message"] and "architecture is not supported" in error["message"]
