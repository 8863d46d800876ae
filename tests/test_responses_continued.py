"""A response that continues another (`previous_response_id`): the conversation so far comes from the job store,
not from the client, and only from the caller's own responses that ended with an answer."""

from __future__ import annotations

import openai
import pytest

from tasks.job import JobStatus
from tests.helpers import DEMO, claim_now, sdk

MODEL = DEMO
pytestmark = pytest.mark.default_catalog


@pytest.fixture
def settings(settings):  # type: ignore[no-untyped-def]
    return settings.model_copy(update={"users": settings.model_validate({"users": "alice:ka,bob:kb"}).users})


def ask(client, text, **kw):  # type: ignore[no-untyped-def]
    return client.responses.create(
        model=MODEL, input=text, max_output_tokens=6, temperature=0, extra_body={"ignore_eos": True}, **kw
    )


def job_of(response_id: str) -> str:
    return "job_" + response_id.removeprefix("resp_")


def turns(store, response) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return [(m.role, m.content) for m in store.get(job_of(response.id)).spec.messages]


def test_each_response_continues_the_conversation_of_the_one_it_names(live_server, start_worker, store):
    start_worker()
    alice = sdk(live_server, "ka")

    # Given a response with instructions, When two more each continue the one before
    first = ask(alice, "My name is Ada.", instructions="Be brief.")
    second = ask(alice, "What is my name?", previous_response_id=first.id)
    third = ask(alice, "Say it again.", previous_response_id=second.id, instructions="Answer in French.")

    # Then each one's model reads the whole conversation: the input and answer of every response before it, and
    # only its own instructions (OpenAI carries a response's instructions no further)
    assert second.previous_response_id == first.id and second.instructions is None
    assert turns(store, second) == [
        ("user", "My name is Ada."),
        ("assistant", first.output_text),
        ("user", "What is my name?"),
    ]
    assert turns(store, third) == [
        ("system", "Answer in French."),
        *turns(store, second),
        ("assistant", second.output_text),
        ("user", "Say it again."),
    ]
    assert alice.responses.retrieve(third.id).previous_response_id == second.id


def items(page) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return [(item.role, item.content[0].text) for item in page]


def test_a_response_lists_the_conversation_it_answered_as_its_input_items_a_page_at_a_time(
    live_server, start_worker, store
):
    start_worker()
    alice, bob = sdk(live_server, "ka"), sdk(live_server, "kb")
    first = ask(alice, "My name is Ada.", instructions="Be brief.")
    second = ask(alice, "What is my name?", previous_response_id=first.id)
    conversation = [("user", "My name is Ada."), ("assistant", first.output_text), ("user", "What is my name?")]

    # newest first by default; the SDK follows the pages (`after` the last id) to the end, 2 items at a time
    assert items(alice.responses.input_items.list(second.id)) == conversation[::-1]
    assert items(alice.responses.input_items.list(second.id, order="asc", limit=2)) == conversation
    page = alice.responses.input_items.list(second.id, order="asc", limit=2)
    assert page.has_more and not page.get_next_page().has_more
    assert items(alice.responses.input_items.list(first.id)) == [("user", "My name is Ada.")]  # instructions apart

    with pytest.raises(openai.NotFoundError):
        bob.responses.input_items.list(second.id)
    for bad, param in (({"order": "newest"}, "order"), ({"after": "msg_nothing"}, "after"), ({"limit": 0}, "limit")):
        with pytest.raises(openai.BadRequestError) as refused:
            alice.responses.input_items.list(second.id, **bad)
        assert refused.value.body["param"] == param, refused.value.body  # type: ignore[index]


def test_a_continued_conversation_is_read_from_the_prefix_cache(live_server, start_worker, store):
    start_worker()
    alice = sdk(live_server, "ka")
    first = ask(alice, "My name is Ada, and I keep the queue in front of the GPU. " * 4)  # past MIN_HIT_TOKENS

    second = ask(alice, "What is my name?", previous_response_id=first.id)

    # the first response's prompt was cached as it ended: the second reads at least that much of its own from it
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens


def test_only_ones_own_response_that_ended_with_an_answer_can_be_continued(live_server, store):
    alice, bob = sdk(live_server, "ka"), sdk(live_server, "kb")
    # Given no worker: alice's background response waits
    waiting = alice.responses.create(model=MODEL, input="hi", background=True, max_output_tokens=4)

    with pytest.raises(openai.BadRequestError) as queued:
        ask(alice, "and then?", previous_response_id=waiting.id)
    with pytest.raises(openai.BadRequestError) as not_bobs:
        ask(bob, "and then?", previous_response_id=waiting.id)
    with pytest.raises(openai.BadRequestError) as unknown:
        ask(alice, "and then?", previous_response_id="resp_nothing")
    alice.responses.cancel(waiting.id)
    with pytest.raises(openai.BadRequestError) as cancelled:
        ask(alice, "and then?", previous_response_id=waiting.id)

    for refused in (queued, not_bobs, unknown, cancelled):
        assert refused.value.body["param"] == "previous_response_id", refused.value.body  # type: ignore[index]
    assert "is queued" in queued.value.body["message"] and "is cancelled" in cancelled.value.body["message"]  # type: ignore[index]
    assert not_bobs.value.body["code"] == unknown.value.body["code"] == "previous_response_not_found"  # type: ignore[index]
    assert queued.value.body["code"] == cancelled.value.body["code"] == "invalid_request"  # type: ignore[index]
    assert [j.id for j in store.list("alice")] == [job_of(waiting.id)] and store.list("bob") == []  # nothing admitted


def test_a_response_whose_worker_died_mid_answer_is_continued_with_its_whole_answer(live_server, store):
    # Given a response whose worker (played here) wrote half an answer and died, and whose next run wrote the rest
    alice = sdk(live_server, "ka")
    first = alice.responses.create(model=MODEL, input="hi", background=True, max_output_tokens=8)
    worker = store.for_worker("w")
    assert worker.take_device() == "ok"
    assert claim_now(store, "w").id == job_of(first.id)
    worker.append(job_of(first.id), (7,), "half an answer", 1)
    worker.hand_back(job_of(first.id))
    assert claim_now(store, "w").id == job_of(first.id)
    worker.append(job_of(first.id), (7,), ", and the rest", 1)
    worker.finish(job_of(first.id), JobStatus.COMPLETED, finish_reason="stop", completion_tokens=2)

    # When a response continues it, Then its history holds the one answer both runs wrote
    second = alice.responses.create(model=MODEL, input="and?", previous_response_id=first.id, background=True)
    assert turns(store, second) == [("user", "hi"), ("assistant", "half an answer, and the rest"), ("user", "and?")]
