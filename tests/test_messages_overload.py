"""Anthropic's Messages API under keys and overload: `x-api-key` authenticates as `Authorization` does, a wrong key is
Anthropic's authentication_error, and a full queue is a 529 overloaded_error with a retry-after that the official
SDK honors, retrying on its own until there is room."""

from __future__ import annotations

import threading
from typing import Any

import anthropic
import httpx
import pytest

from tests.helpers import wait_ended, wait_event
from tests.test_messages import ASK, sdk

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def settings(settings):  # type: ignore[no-untyped-def]
    """Two keys, and a queue of one waiting job (the overload story's)."""
    users = settings.model_validate({"users": "alice:ka,bob:kb"}).users
    return settings.model_copy(update={"users": users, "max_queue": 1})


def test_a_wrong_key_is_an_authentication_error_and_x_api_key_authenticates(live_server, model, store):
    with pytest.raises(anthropic.AuthenticationError) as err:
        sdk(live_server, "wrong").messages.create(model=model, max_tokens=4, messages=ASK)
    assert err.value.body["error"]["type"] == "authentication_error"
    body = {"model": model, "max_tokens": 4, "messages": ASK, "stream": True}
    with httpx.stream(
        "POST", f"{live_server}/v1/messages", json=body, headers={"x-api-key": "ka"}, timeout=30
    ) as reply:
        assert reply.status_code == 200 and next(reply.iter_lines()) == "event: message_start"
        assert [j.owner for j in store.list("alice")] == ["alice"]  # (its job, waiting: no worker runs)


def test_an_overloaded_queue_is_a_529_the_sdk_retries_after_retry_after(start_worker, live_server, model, store):
    def post(path: str, key: str, **body: Any) -> dict[str, Any]:
        reply = httpx.post(f"{live_server}{path}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert reply.status_code == 202, reply.text
        return dict(reply.json())

    # Given a queue that holds one waiting job, and holds one (the worker busy with another, for a few seconds: long
    # enough that bob asks before it ends, on a loaded machine too; the demo model makes ~800 tokens/s here alone)
    start_worker()
    busy = post("/v1/jobs", "ka", prompt="keep the GPU busy", max_tokens=3000, ignore_eos=True)
    store.follow_live(store.get(busy["id"]))  # (its tokens counted as they come, not once a second)
    # its pace measured from its tokens so far: so the waiting job's ETA, and the retry-after, is when it ends (not a
    # guess at a model never timed, 55 ms a token, which would tell the SDK to wait minutes)
    wait_event(store, busy["id"], lambda e: e.type == "token" and store.get(busy["id"]).usage.completion_tokens >= 100)
    waiting = post("/v1/jobs", "ka", prompt="wait", max_tokens=4)
    # When bob asks through the SDK, which retries
    seen: list[Any] = []  # (the SDK's own httpx's responses)
    overloaded = threading.Event()

    def record(response: Any) -> None:
        seen.append(response)
        if response.status_code == 529:
            response.read()  # (kept: the SDK reads it again)
            overloaded.set()

    client = sdk(
        live_server, "kb", max_retries=4, http_client=anthropic.DefaultHttpxClient(event_hooks={"response": [record]})
    )
    answers: list[Any] = []
    asking = threading.Thread(
        target=lambda: answers.append(client.messages.create(model=model, max_tokens=4, messages=ASK))
    )
    asking.start()
    # Then it is told 529 overloaded_error, with a retry-after of when the waiting job should have started
    assert overloaded.wait(60)
    first = next(r for r in seen if r.status_code == 529)
    assert first.json()["error"]["type"] == "overloaded_error" and 1 <= int(first.headers["retry-after"]) <= 60
    # And the SDK, waiting that long on its own, is answered once the queue has room
    asking.join(150)
    assert answers and answers[0].type == "message"
    assert [r.status_code for r in seen][-1] == 200
    assert wait_ended(store, waiting["id"])["status"] == "completed"
