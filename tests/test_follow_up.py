"""A chat continued from its page carries the history as the API's own messages would (an assistant's tool calls, a
tool's call id) and the job's every option: its sampling, penalties, biases, stops, log probabilities and the format
its answer follows."""

from __future__ import annotations

import pytest

from tests.helpers import wait_ended

ALICE = {"Authorization": "Bearer ka"}
HISTORY = [
    {"role": "system", "content": "You answer in JSON."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'},
    {"role": "user", "content": "So?"},
]
OPTIONS = {
    "max_tokens": 6,
    "temperature": 0.7,
    "top_p": 0.9,
    "seed": 7,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.25,
    "logit_bias": {"5": -10, "9": 3},
    "stop": ["zz"],
    "logprobs": True,
    "top_logprobs": 2,
    "response_format": {"type": "json_object"},
}


@pytest.fixture
def settings(settings):  # type: ignore[no-untyped-def]
    return settings.model_copy(update={"users": settings.model_validate({"users": "alice:ka"}).users})


def signed_in(app):  # type: ignore[no-untyped-def]
    """A browser signed in as alice, and its CSRF token."""
    browser = app.test_client()
    browser.get("/login")
    with browser.session_transaction() as session:
        token = session["csrf"]
    assert browser.post("/login", data={"key": "ka", "csrf_token": token}).status_code == 303
    with browser.session_transaction() as session:
        return browser, session["csrf"]


def test_a_follow_up_carries_the_tool_calls_of_its_history_and_the_jobs_options(app, store, model, start_worker):
    # Given a completed chat whose history holds a tool call and its result, asked with every option
    start_worker()
    api = app.test_client()
    asked = api.post("/v1/chat/completions", json={"model": model, "messages": HISTORY, **OPTIONS}, headers=ALICE)
    assert asked.status_code == 200, asked.get_json()
    first = store.get(asked.headers["x-onelane-job-id"])
    assert first.status.value == "completed"

    # When its owner continues it from its page
    browser, token = signed_in(app)
    sent = browser.post(
        f"/jobs/{first.id}/continue",
        data={"prompt": "And tomorrow?", "csrf_token": token},
        headers={"Accept": "application/json"},
    )
    assert sent.status_code == 202, sent.get_json()
    follow_up = store.get(sent.get_json()["job"]["id"])

    # Then its messages are the history as sent (the call and its id kept), the answer, then the new message
    earlier = first.spec.messages or ()
    messages = follow_up.spec.messages or ()
    assert messages[: len(earlier)] == earlier
    assert messages[2].tool_calls[0].id == "call_1" and messages[3].tool_call_id == "call_1"
    assert [(m.role, m.content) for m in messages[len(earlier) :]] == [
        ("assistant", first.output),
        ("user", "And tomorrow?"),
    ]
    # and its options are the job's: sampling, penalties, biases, stops, log probabilities, the answer's format
    assert follow_up.spec.params == first.spec.params
    assert follow_up.spec.constraint == first.spec.constraint is not None
    assert (follow_up.spec.model, follow_up.spec.priority, follow_up.spec.watched) == (model, "interactive", True)

    # And it runs as any job does
    assert wait_ended(store, follow_up.id)["status"] == "completed"
