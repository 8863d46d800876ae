"""A chat message's `name` (which participant of its role speaks) is kept with the job and shown to the model: as the
message's `name` to a chat template that renders it, else at the head of the message's text. A name that is not
OpenAI's shape is refused naming the message's field."""

from __future__ import annotations

import pytest

from tasks.chat_prompt import chat_input
from tasks.job import Message

HISTORY = [
    {"role": "system", "content": "You chair the meeting."},
    {"role": "user", "content": "I say yes.", "name": "alice"},
    {"role": "user", "content": "I say no.", "name": "bob"},
]


def test_a_messages_name_is_kept_and_read_by_the_model(app, store, model, engine, start_worker):
    # Given the demo model, whose template (ChatML) writes no name
    start_worker()
    client = app.test_client()

    # When a chat names the speakers of its user messages
    body = {"model": model, "messages": HISTORY, "max_tokens": 2}
    answer = client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.get_json()
    job = store.get(answer.headers["x-onelane-job-id"])

    # Then the job keeps the names, and shows them back
    assert [m.name for m in job.spec.messages or ()] == [None, "alice", "bob"]
    shown = client.get(f"/v1/jobs/{job.id}").get_json()["messages"]
    assert [m.get("name") for m in shown] == [None, "alice", "bob"] and "name" not in shown[0]
    # and the prompt the worker read tells who said what
    prompt = engine.prompt_tokens(job.spec)
    assert job.usage.prompt_tokens == len(prompt)
    text = engine.tokenizer.decode(prompt)
    assert "alice: I say yes." in text and "bob: I say no." in text


@pytest.mark.parametrize("name", ["Alice Smith", "", "x" * 65, "a\nb"])
def test_a_name_not_of_openais_shape_is_refused_by_its_field(app, model, name):
    client = app.test_client()
    messages = [{"role": "user", "content": "hi", "name": name}]
    for path, body, status in [
        ("/v1/chat/completions", {"model": model, "messages": messages}, 400),
        ("/v1/jobs", {"messages": messages}, 422),  # (the jobs API's status for a value out of range)
    ]:
        refused = client.post(path, json=body)
        assert refused.status_code == status, (path, refused.get_json())
        assert refused.get_json()["error"]["param"] == "messages.0.name"


def test_a_template_that_renders_names_gets_them_as_the_messages_name(demo_model):
    from transformers import AutoTokenizer

    # Given a tokenizer whose template writes a message's name
    tokenizer = AutoTokenizer.from_pretrained(str(demo_model))
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}{% if m.name %} ({{ m.name }}){% endif %}: "
        "{{ m['content'] }}<|im_end|>{% endfor %}"
    )
    messages = (Message(role="user", content="hi", name="alice"),)

    # When a named message is made the template's input, the name goes as its own key, the text unchanged
    turns, _ = chat_input(messages, (), tokenizer)
    assert turns == [{"role": "user", "content": "hi", "name": "alice"}]
    assert tokenizer.apply_chat_template(turns, tokenize=False) == "<|im_start|>user (alice): hi<|im_end|>"
