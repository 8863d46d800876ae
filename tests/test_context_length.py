"""A prompt that does not fit its model is refused before it runs (issue 60, items 4 and 10): 32,000 emoji are
128,000 tokens, far past a model's context; they are counted at admission with the model's own tokenizer and refused
at once, in OpenAI's shape (`context_length_exceeded`) and in Anthropic's ("prompt is too long"), and the worker
refuses one it is handed all the same. An answer stops at the context: a max_tokens past it is clipped, not refused.

The model here is the demo model with a context of CONTEXT tokens (the session's has a long one)."""

from __future__ import annotations

import io
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tasks import keys
from tasks.job import JobSpec, Message, new_job_id
from tests.conftest import with_context
from tests.helpers import chat_line, sdk, wait_batch, wait_ended

pytestmark = pytest.mark.timeout(300)

CONTEXT = 1024
LONG = "\U0001f600" * 32_000  # 4 tokens each for the demo model's tokenizer (and most byte-level BPEs)
ASKED = 32_000  # Claude Code's max_tokens when told nothing


@pytest.fixture(scope="session")
def short_model(tmp_path_factory: pytest.TempPathFactory, demo_model: Path) -> Path:
    path = tmp_path_factory.mktemp("models") / "short"
    shutil.copytree(demo_model, path)
    return with_context(path, CONTEXT)


@pytest.fixture
def settings(settings, short_model):  # type: ignore[no-untyped-def]
    """The short model, served alone, with the server's own limit on max_tokens."""
    return settings.model_copy(update={"model": str(short_model), "max_tokens_limit": 4096})


def refusal(live_server: str, path: str, body: dict[str, Any]) -> tuple[requests.Response, float]:
    began = time.monotonic()
    answer = requests.post(f"{live_server}{path}", json=body, timeout=60)
    return answer, time.monotonic() - began


ROUTES = {
    "/v1/chat/completions": ({"messages": [{"role": "user", "content": LONG}], "max_tokens": 16}, "messages"),
    "/v1/completions": ({"prompt": LONG, "max_tokens": 16}, "prompt"),
    "/v1/responses": ({"input": LONG, "max_output_tokens": 16}, "input"),
}


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_prompt_of_128000_tokens_is_refused_at_once_in_openais_shape(live_server, model, redis_client, path):
    body, param = ROUTES[path]
    answer, _ = refusal(live_server, path, {"model": model, **body})

    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["type"], error["param"]) == ("context_length_exceeded", "invalid_request_error", param)
    tokens = int(error["message"].split("resulted in ")[1].split()[0])
    assert tokens >= 128_000
    what = "prompt" if param == "prompt" else "messages"
    assert error["message"] == (
        f"This model's maximum context length is {CONTEXT} tokens. However, your {what} resulted in {tokens} "
        f"tokens. Please reduce the length of the {what}."
    )
    assert redis_client.zcard(keys.QUEUE) == 0  # nothing was admitted


def test_anthropics_routes_refuse_it_in_anthropics_words_and_count_tokens_still_counts_it(
    start_worker, live_server, model, redis_client, settings
):
    start_worker(served=settings)
    messages = [{"role": "user", "content": LONG}]
    answer, _ = refusal(live_server, "/v1/messages", {"model": model, "max_tokens": ASKED, "messages": messages})

    assert answer.status_code == 400, answer.text
    counted = requests.post(
        f"{live_server}/v1/messages/count_tokens", json={"model": model, "messages": messages}, timeout=120
    )
    assert counted.status_code == 200, counted.text
    tokens = counted.json()["input_tokens"]  # (the worker's count, as before)
    assert answer.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"prompt is too long: {tokens} tokens > {CONTEXT - 1} maximum",
        },
    }


def test_another_users_question_is_answered_while_the_long_prompt_is_refused(
    start_worker, live_server, model, settings
):
    start_worker(served=settings)
    long, took = refusal(
        live_server, "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": LONG}]}
    )
    began = time.monotonic()
    short = sdk(live_server).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0
    )
    waited = time.monotonic() - began

    assert long.status_code == 400 and short.choices[0].finish_reason in ("stop", "length")
    assert took < 30 and waited < 30, (took, waited)  # (before: the long prompt ran alone, its answer a minute off)


def test_the_worker_refuses_a_prompt_it_is_handed_that_does_not_fit(start_worker, store, model, settings):
    # Given a job admitted without a count (as from a batch's line): the worker counts it as it joins
    worker = start_worker(served=settings)
    spec = JobSpec(owner="alice", model=model, messages=(Message(role="user", content=LONG),))
    long = store.admit(new_job_id(), spec, ttl_s=600).id
    short = store.admit(new_job_id(), JobSpec(owner="bob", model=model, prompt="hi"), ttl_s=600).id

    refused, answered = wait_ended(store, long, timeout_s=120), wait_ended(store, short, timeout_s=120)

    assert refused["status"] == "failed" and refused["error"]["type"] == "context_length_exceeded", refused
    assert f"maximum context length is {CONTEXT} tokens" in refused["error"]["message"]
    assert answered["status"] == "completed"
    assert worker.runner.engine is not None and worker.runner.engine.context == CONTEXT


def test_a_batch_line_too_long_fails_by_its_custom_id_and_the_others_are_answered(
    client, start_worker, store, model, settings
):
    start_worker(served=settings)
    data = b"".join(
        json.dumps(line).encode() + b"\n"
        for line in (chat_line("short", model=model), chat_line("long", LONG, model=model))
    )
    source = client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_batch(store, batch.id, timeout_s=120)

    final = client.batches.retrieve(batch.id)
    assert (final.request_counts.completed, final.request_counts.failed) == (1, 1)
    (error,) = [json.loads(line) for line in client.files.content(final.error_file_id).text.splitlines()]
    assert error["custom_id"] == "long" and error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["code"] == "context_length_exceeded"


def test_an_answer_stops_at_the_context_and_the_charge_reads_the_prompts_tokens(
    jobs, start_worker, store, redis_client, settings
):
    # Given a job whose max_tokens is far past what its prompt leaves of the context
    job = jobs.submit("hi there", max_tokens=4096, ignore_eos=True)
    fields = redis_client.hgetall(keys.job(job["id"]))
    counted = int(fields["counted"])
    assert int(fields["max_tokens"]) == CONTEXT - counted  # what its ETA and its charge read

    # When it runs, Then it ends at the context, cut for length
    start_worker(served=settings)
    done = wait_ended(store, job["id"], timeout_s=120)
    assert (done["status"], done["finish_reason"]) == ("completed", "length")
    assert done["usage"]["prompt_tokens"] == counted
    assert done["usage"]["prompt_tokens"] + done["usage"]["completion_tokens"] == CONTEXT


def test_claude_codes_default_max_tokens_is_served_where_openais_limit_refuses_it(
    start_worker, live_server, model, settings
):
    start_worker(served=settings)
    ask = {"model": model, "max_tokens": ASKED, "messages": [{"role": "user", "content": "hi"}]}
    anthropic = requests.post(f"{live_server}/v1/messages", json=ask, timeout=120)
    openai = requests.post(f"{live_server}/v1/chat/completions", json=ask, timeout=120)

    assert anthropic.status_code == 200, anthropic.text
    assert anthropic.json()["usage"]["output_tokens"] <= CONTEXT
    assert openai.status_code == 400 and openai.json()["error"]["param"] == "max_tokens"
