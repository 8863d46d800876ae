"""The rest of what OpenAI clients send, honored, with the official SDK unchanged: `n` answers (greedy: the same;
seeded: distinct and reproducible; streamed interleaved by index), log probabilities on chat, completions and the
Responses API (whole and streamed, the same tokens either way), penalties and `logit_bias` changing the answer as
their definitions say, `echo` scoring a prompt, `best_of` choosing by mean log probability, and every value out of
range refused naming its field."""

from __future__ import annotations

import json
from collections import Counter

import openai
import pytest
import requests

from tasks.logprobs import read_entries
from tests.helpers import BUSY, chat_line, wait_batch, wait_ended
from tests.test_openai_batches import by_custom_id, jsonl, submit

pytestmark = pytest.mark.timeout(300)  # (the demo model, served as `model`: the `engine` the stories read ids from)
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture
def worker(start_worker):  # type: ignore[no-untyped-def]
    return start_worker(max_batch=8)  # (a request's answers run side by side, as on a real worker)


@pytest.fixture
def chat(client, model):  # type: ignore[no-untyped-def]
    def ask(content="Tell me a story", **kw):  # type: ignore[no-untyped-def]
        return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}], **kw)

    return ask


@pytest.fixture
def complete(client, model):  # type: ignore[no-untyped-def]
    def ask(prompt="Once upon a time", **kw):  # type: ignore[no-untyped-def]
        return client.completions.create(model=model, prompt=prompt, **kw)

    return ask


def streamed(chunks) -> dict[int, list]:  # type: ignore[no-untyped-def]
    """A stream's choices, by index, in the order they came."""
    by_index: dict[int, list] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            by_index.setdefault(choice.index, []).append(choice)
    return by_index


def text_of(bytes_lists) -> str:  # type: ignore[no-untyped-def]
    return b"".join(bytes(b) for b in bytes_lists).decode()


# --- n ------------------------------------------------------------------------------------------------------------


def test_n_greedy_answers_are_one_answer_n_times_each_indexed(client, model, worker, store):
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hi"}], n=4, max_tokens=8, **GREEDY
    )
    answer = raw.parse()

    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    assert len({c.message.content for c in answer.choices}) == 1
    ids = raw.headers["x-onelane-job-ids"].split(",")
    assert len(ids) == 4 and ids[0] == raw.headers["x-onelane-job-id"]
    jobs = [store.get(job_id) for job_id in ids]
    assert [job.spec.choice.index for job in jobs] == [0, 1, 2, 3] and {job.spec.choice.group for job in jobs} == {
        ids[0]
    }
    # the prompt once, every answer's tokens
    assert answer.usage.prompt_tokens == jobs[0].usage.prompt_tokens and answer.usage.completion_tokens == 32


def test_n_seeded_answers_are_distinct_and_the_same_request_gives_the_same_ones(chat, worker):
    def ask() -> list[str]:
        answer = chat(n=4, seed=42, temperature=1.0, max_tokens=12, extra_body={"ignore_eos": True})
        return [c.message.content for c in answer.choices]

    first = ask()
    assert len(set(first)) == 4
    assert ask() == first


def test_a_streamed_n_interleaves_every_answer_by_index_each_whole(chat, worker):
    whole = chat("hi", n=3, max_tokens=10, **GREEDY)
    stream = chat("hi", n=3, max_tokens=10, stream=True, stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)

    by_index = streamed(chunks)
    assert sorted(by_index) == [0, 1, 2]
    for index, choices in by_index.items():
        assert "".join(c.delta.content or "" for c in choices) == whole.choices[index].message.content
        assert [c.finish_reason for c in choices if c.finish_reason] == ["length"]  # one finish reason each
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 30
    assert len({c.id for c in chunks}) == 1


def test_closing_a_stream_of_n_answers_cancels_them_all(client, model, worker, store):
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "x"}], n=2, max_tokens=BUSY, stream=True, **GREEDY
    )
    ids = raw.headers["x-onelane-job-ids"].split(",")
    chunks = raw.parse()
    for _, _ in zip(range(6), chunks):
        pass
    chunks.close()

    for job_id in ids:
        done = wait_ended(store, job_id)
        assert done["status"] == "cancelled" and done["error"]["type"] == "client_gone"


def test_n_answers_are_admitted_all_or_none(settings, make_app, store, model):
    # Given a quota of two waiting jobs (and no worker: they wait), When a request asks for three answers
    client = make_app(settings.model_copy(update={"max_queued_per_user": 2})).test_client()
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "n": 3}

    refused = client.post("/v1/chat/completions", json=body)

    # Then it is refused as one request, naming `n` (it can never fit), and none of its jobs remains
    assert refused.status_code == 400 and refused.get_json()["error"]["param"] == "n"
    assert store.list("local") == []


# --- log probabilities ------------------------------------------------------------------------------------------


def check_tops(entries, top: int) -> None:  # type: ignore[no-untyped-def]
    """Each token's alternatives: `top` of them, likeliest first, the greedy choice the likeliest."""
    for entry in entries:
        logprobs = [t.logprob for t in entry.top_logprobs]
        assert len(logprobs) == top and logprobs == sorted(logprobs, reverse=True)
        assert entry.logprob <= 0 and entry.logprob == pytest.approx(logprobs[0], abs=1e-5)


def test_chat_logprobs_whole_and_streamed_are_the_same_tokens(chat, worker):
    whole = chat(logprobs=True, top_logprobs=3, max_tokens=12, **GREEDY)
    stream = chat(logprobs=True, top_logprobs=3, max_tokens=12, stream=True, **GREEDY)

    choice = whole.choices[0]
    content = choice.logprobs.content
    assert len(content) == whole.usage.completion_tokens == 12  # (ignore_eos: no end of sequence among them)
    check_tops(content, 3)
    assert text_of(e.bytes for e in content) == choice.message.content
    pieces = [c.logprobs.content for c in streamed(stream)[0] if c.logprobs is not None]
    assert [e.model_dump() for piece in pieces for e in piece] == [e.model_dump() for e in content]


def test_chat_without_logprobs_has_none(chat, worker):
    assert chat(max_tokens=3, **GREEDY).choices[0].logprobs is None


def test_an_answer_that_ends_has_no_entry_for_its_end_of_sequence(chat, worker, engine):
    # (the demo model never ends by itself: a bias ends it at once)
    eos = {str(token): 100 for token in engine.eos}
    answer = chat(logprobs=True, max_tokens=20, logit_bias=eos, temperature=0)

    assert answer.choices[0].finish_reason == "stop" and answer.usage.completion_tokens == 1
    assert answer.choices[0].logprobs.content == []


def test_completion_logprobs_whole_and_streamed_are_the_same_tokens(complete, worker):
    whole = complete(logprobs=2, max_tokens=10, **GREEDY)
    stream = complete(logprobs=2, max_tokens=10, stream=True, **GREEDY)

    choice = whole.choices[0]
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == whole.usage.completion_tokens == 10
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    for chosen, tops in zip(logprobs.token_logprobs, logprobs.top_logprobs):
        assert 1 <= len(tops) <= 2 and chosen == pytest.approx(max(tops.values()), abs=1e-5)
    assert logprobs.text_offset == sorted(logprobs.text_offset) and logprobs.text_offset[0] == 0
    pieces = [c.logprobs for c in streamed(stream)[0] if c.logprobs is not None]
    for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [v for piece in pieces for v in getattr(piece, field)] == getattr(logprobs, field), field


def test_completion_logprobs_0_gives_each_tokens_own_without_alternatives(complete, worker):
    logprobs = complete(logprobs=0, max_tokens=4, **GREEDY).choices[0].logprobs
    assert len(logprobs.token_logprobs) == 4 and logprobs.top_logprobs is None


def test_echo_with_max_tokens_0_scores_the_prompt_and_generates_nothing(complete, worker):
    prompt = "The quick brown fox jumps over the lazy dog"
    scored = complete(prompt, echo=True, max_tokens=0, logprobs=1)

    choice = scored.choices[0]
    assert choice.text == prompt and choice.finish_reason == "length"
    assert scored.usage.completion_tokens == 0
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == scored.usage.prompt_tokens
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None  # nothing predicts the first
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert "".join(logprobs.tokens) == prompt
    assert logprobs.text_offset == [len("".join(logprobs.tokens[:i])) for i in range(len(logprobs.tokens))]


def test_echo_puts_the_prompt_before_the_answer_whole_and_streamed(complete, worker):
    prompt = "Once upon a time"
    whole = complete(prompt, echo=True, logprobs=0, max_tokens=5, **GREEDY)
    stream = list(complete(prompt, echo=True, logprobs=0, max_tokens=5, stream=True, **GREEDY))

    choice = whole.choices[0]
    assert choice.text.startswith(prompt) and len(choice.text) > len(prompt)
    assert len(choice.logprobs.tokens) == whole.usage.prompt_tokens + 5
    assert "".join(c.text for c in streamed(stream)[0]) == choice.text
    offsets = [o for c in streamed(stream)[0] if c.logprobs for o in c.logprobs.text_offset]
    assert offsets == choice.logprobs.text_offset


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "London", "Tokyo"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.default_model
def test_an_answer_of_calls_has_every_tokens_logprobs_whole_and_streamed(chat, worker):
    ask = {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0}
    ask |= {"logprobs": True, "top_logprobs": 1, "max_tokens": 60}
    whole = chat("What is the weather in Paris?", **ask)
    stream = chat("What is the weather in Paris?", stream=True, **ask)

    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "get_weather"
    content = choice.logprobs.content  # the calls' tokens: the answer's text, as the model wrote it
    assert whole.usage.completion_tokens - 1 <= len(content) <= whole.usage.completion_tokens
    assert "get_weather" in text_of(e.bytes for e in content) and "Paris" in text_of(e.bytes for e in content)
    pieces = [c.logprobs.content for c in streamed(stream)[0] if c.logprobs is not None]
    assert [e.model_dump() for piece in pieces for e in piece] == [e.model_dump() for e in content]


@pytest.mark.default_model
def test_echo_scores_a_sentence_above_the_same_words_shuffled(complete, worker):
    def mean(text: str) -> float:
        scored = complete(text, echo=True, max_tokens=0, logprobs=0).choices[0].logprobs.token_logprobs
        return sum(scored[1:]) / len(scored[1:])

    assert mean("The capital of France is Paris.") > mean("Paris capital The is France of.") + 1


# --- penalties and biases ---------------------------------------------------------------------------------------


def ids_of(engine, token: str) -> list[int]:  # type: ignore[no-untyped-def]
    """Every token id of the model whose text is `token`."""
    raw = token.encode()
    return [i for i in range(engine.vocab) if engine.token_bytes[i] == raw]


def test_a_token_biased_minus_100_never_appears(chat, worker, engine):
    free = chat(logprobs=True, max_tokens=16, **GREEDY).choices[0]
    first = free.logprobs.content[0].token
    banned = {str(i): -100 for i in ids_of(engine, first)}

    biased = chat(logprobs=True, max_tokens=16, logit_bias=banned, **GREEDY).choices[0]

    assert first not in [e.token for e in biased.logprobs.content]
    assert biased.message.content != free.message.content


def test_a_token_biased_plus_100_is_every_token(chat, worker, engine):
    (token,) = ids_of(engine, " the")[:1]

    forced = chat(logprobs=True, max_tokens=6, logit_bias={str(token): 100}, **GREEDY).choices[0]

    assert [e.token for e in forced.logprobs.content] == [" the"] * 6


def test_a_frequency_penalty_makes_a_repeating_answer_repeat_less(complete, worker):
    def repeats(**kw) -> int:  # type: ignore[no-untyped-def]
        answer = complete("the the the the", logprobs=0, max_tokens=40, **GREEDY, **kw)
        return Counter(answer.choices[0].logprobs.tokens).most_common(1)[0][1]

    free = repeats()
    assert free >= 10  # (greedy decoding of this prompt repeats itself)
    assert repeats(frequency_penalty=2.0) < free / 2
    assert repeats(presence_penalty=2.0) < free


def test_a_logit_bias_beyond_the_vocabulary_is_a_bad_request_naming_it(chat, worker, engine):
    beyond = {str(engine.vocab + 5): 1}
    with pytest.raises(openai.BadRequestError) as refused:
        chat(n=2, max_tokens=4, logit_bias=beyond)
    assert refused.value.body["param"] == "logit_bias" and refused.value.body["type"] == "invalid_request_error"

    stream = chat(max_tokens=4, logit_bias=beyond, stream=True)
    with pytest.raises(openai.APIError) as failed:
        list(stream)
    assert "logit_bias" in str(failed.value)


# --- the Responses API --------------------------------------------------------------------------------------------


def test_a_response_includes_its_output_texts_logprobs_whole_and_streamed(client, model, worker):
    kw = {"model": model, "input": "hi", "max_output_tokens": 8, "temperature": 0, "top_logprobs": 2}
    kw |= {"include": ["message.output_text.logprobs"], "extra_body": {"ignore_eos": True}}
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))

    logprobs = whole.output[0].content[0].logprobs
    assert len(logprobs) == whole.usage.output_tokens == 8
    check_tops(logprobs, 2)
    assert text_of(e.bytes for e in logprobs) == whole.output_text
    deltas = [e for ev in events if ev.type == "response.output_text.delta" for e in ev.logprobs]
    (done,) = [ev for ev in events if ev.type == "response.output_text.done"]
    final = events[-1].response.output[0].content[0].logprobs
    assert (
        [e.model_dump() for e in deltas] == [e.model_dump() for e in done.logprobs] == [e.model_dump() for e in final]
    )
    assert [e.model_dump() for e in final] == [e.model_dump() for e in logprobs]


def test_a_response_without_the_include_has_no_logprobs(client, model, worker):
    whole = client.responses.create(model=model, input="hi", max_output_tokens=3)
    assert whole.output[0].content[0].logprobs == []


# --- best_of -----------------------------------------------------------------------------------------------------


def test_best_of_returns_the_answer_of_highest_mean_logprob_among_its_candidates(client, model, store, worker):
    raw = client.completions.with_raw_response.create(
        model=model, prompt="Once upon a time", best_of=4, seed=3, temperature=1.0, max_tokens=8, logprobs=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    answer = raw.parse()

    candidates = [store.get(job_id) for job_id in raw.headers["x-onelane-job-ids"].split(",")]
    assert len(candidates) == 4 and len({c.output for c in candidates}) > 1

    def mean(job) -> float:  # type: ignore[no-untyped-def]
        entries = read_entries(job.logprobs)
        return sum(e.logprob for e in entries) / len(entries)

    best = max(candidates, key=mean)
    (choice,) = answer.choices
    assert choice.index == 0 and choice.text == best.output
    assert sum(choice.logprobs.token_logprobs) / 8 == pytest.approx(mean(best))
    assert answer.usage.completion_tokens == 32  # every answer generated


def test_best_of_without_logprobs_shows_none(complete, worker):
    answer = complete(best_of=2, n=2, max_tokens=3, seed=1)
    assert [c.index for c in answer.choices] == [0, 1] and {c.logprobs for c in answer.choices} == {None}


# --- a batch's lines ------------------------------------------------------------------------------------------


def test_a_batch_line_shows_its_logprobs_and_one_of_n_answers_is_refused_by_name(client, model, store, worker):
    # Given a chat batch: a line that asks for log probabilities, one that asks for a logit_bias beyond the
    # vocabulary, one of n = 2 answers; and a completions batch that scores a prompt
    chats = jsonl(
        chat_line("scored", model=model, logprobs=True, top_logprobs=2),
        chat_line("beyond", model=model, logit_bias={"100000": 1}),
        chat_line("two", model=model, n=2),
    )
    text = {"custom_id": "echo", "method": "POST", "url": "/v1/completions"}
    texts = jsonl(
        {**text, "body": {"model": model, "prompt": "the lazy dog", "echo": True, "max_tokens": 0, "logprobs": 1}}
    )

    batch, echo = submit(client, chats), submit(client, texts, endpoint="/v1/completions")
    wait_batch(store, batch.id)
    wait_batch(store, echo.id)

    # Then the answers have their log probabilities as the endpoint shows them; n is refused by name (a line is one
    # job); a token id beyond the vocabulary is the request's fault, as on the endpoint
    output = by_custom_id(client, client.batches.retrieve(batch.id).output_file_id)
    errors = by_custom_id(client, client.batches.retrieve(batch.id).error_file_id)
    content = output["scored"]["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert len(content) == 4 and all(len(e["top_logprobs"]) == 2 for e in content)
    assert errors["two"]["error"]["code"] == "invalid_request" and "(n)" in errors["two"]["error"]["message"]
    beyond = errors["beyond"]["response"]
    assert beyond["status_code"] == 400 and beyond["body"]["error"]["param"] == "logit_bias"
    scored = by_custom_id(client, client.batches.retrieve(echo.id).output_file_id)["echo"]["response"]["body"]
    assert (
        scored["choices"][0]["text"] == "the lazy dog" and scored["choices"][0]["logprobs"]["token_logprobs"][0] is None
    )


# --- refusals -----------------------------------------------------------------------------------------------------

CHAT = {"messages": [{"role": "user", "content": "hi"}]}  # (and the story's model)
TEXT = {"prompt": "hi"}
RESPONSE = {"input": "hi"}
OUT_OF_RANGE = [
    ("/v1/chat/completions", CHAT, {"n": 0}, "n"),
    ("/v1/chat/completions", CHAT, {"n": 17}, "n"),
    ("/v1/chat/completions", CHAT, {"n": 2.0}, "n"),
    ("/v1/chat/completions", CHAT, {"presence_penalty": 2.5}, "presence_penalty"),
    ("/v1/chat/completions", CHAT, {"frequency_penalty": -2.01}, "frequency_penalty"),
    ("/v1/chat/completions", CHAT, {"frequency_penalty": "1"}, "frequency_penalty"),
    ("/v1/chat/completions", CHAT, {"logit_bias": {"a": 1}}, "logit_bias"),
    ("/v1/chat/completions", CHAT, {"logit_bias": {"-1": 1}}, "logit_bias"),
    ("/v1/chat/completions", CHAT, {"logit_bias": {"5": 101}}, "logit_bias"),
    ("/v1/chat/completions", CHAT, {"logit_bias": {"5": True}}, "logit_bias"),
    ("/v1/chat/completions", CHAT, {"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
    ("/v1/chat/completions", CHAT, {"logit_bias": [1]}, "logit_bias"),
    ("/v1/chat/completions", CHAT, {"logprobs": 1}, "logprobs"),
    ("/v1/chat/completions", CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", CHAT, {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", CHAT, {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", CHAT, {"logprobs": False, "top_logprobs": 0}, "top_logprobs"),
    ("/v1/chat/completions", CHAT, {"echo": True}, "echo"),
    ("/v1/chat/completions", CHAT, {"best_of": 2}, "best_of"),
    ("/v1/completions", TEXT, {"logprobs": 6}, "logprobs"),
    ("/v1/completions", TEXT, {"logprobs": True}, "logprobs"),
    ("/v1/completions", TEXT, {"echo": 1}, "echo"),
    ("/v1/completions", TEXT, {"best_of": 0}, "best_of"),
    ("/v1/completions", TEXT, {"best_of": 17}, "best_of"),
    ("/v1/completions", TEXT, {"best_of": 2, "n": 3}, "best_of"),
    ("/v1/completions", TEXT, {"best_of": 2, "stream": True}, "best_of"),
    ("/v1/completions", TEXT, {"max_tokens": 0}, "max_tokens"),
    ("/v1/completions", TEXT, {"max_tokens": -1, "echo": True}, "max_tokens"),
    ("/v1/completions", TEXT, {"n": 17}, "n"),
    ("/v1/completions", TEXT, {"presence_penalty": -3}, "presence_penalty"),
    ("/v1/responses", RESPONSE, {"top_logprobs": 21}, "top_logprobs"),
    ("/v1/responses", RESPONSE, {"top_logprobs": 3}, "top_logprobs"),
    ("/v1/responses", RESPONSE, {"include": ["file_search_call.results"]}, "include"),
    ("/v1/responses", RESPONSE, {"include": "message.output_text.logprobs"}, "include"),
]


@pytest.mark.parametrize(
    "path,body,fields,param",
    OUT_OF_RANGE,
    ids=[f"{p.rsplit('/', 1)[1]} {json.dumps(f)[:40]}" for p, _, f, _ in OUT_OF_RANGE],
)
def test_a_value_out_of_range_is_a_bad_request_naming_its_field(jobs, store, model, path, body, fields, param):
    response = jobs.client.post(path, json={"model": model, **body, **fields})

    assert response.status_code == 400, response.get_json()
    error = response.get_json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert store.list("local") == []


def test_an_unknown_include_is_named_in_the_message(jobs, model):
    error = jobs.client.post(
        "/v1/responses", json={"model": model, **RESPONSE, "include": ["file_search_call.results"]}
    )
    assert "file_search_call.results" in error.get_json()["error"]["message"]


def test_raw_stream_of_n_has_every_index_then_done(live_server, model, worker):
    body = {"model": model, **TEXT, "n": 2, "max_tokens": 3, "stream": True, "temperature": 0}
    lines = [ln for ln in requests.post(f"{live_server}/v1/completions", json=body, timeout=30).text.splitlines() if ln]
    chunks = [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1] if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert {c["choices"][0]["index"] for c in chunks} == {0, 1}
