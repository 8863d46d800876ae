"""OpenAI's Batch API on the queue, with the official SDK, unchanged: upload a JSONL file, create a batch, follow it to
its end, read the output and error files by custom_id; cancel with partial results; a window that ends; a batch
that feeds the queue as it drains, outside its owner's quota; refusals in words."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import openai
import pytest
from werkzeug.serving import make_server

from tasks import keys
from tasks.batches import BatchStore, job_id_of
from tasks.job import JobStatus
from tests.helpers import BUSY, DEMO, chat_line, sdk, wait_batch, wait_ended, wait_event

MODEL = DEMO
pytestmark = pytest.mark.default_catalog


@pytest.fixture
def client_with(settings, make_app):  # type: ignore[no-untyped-def]
    """An SDK client of a live app on the story's own settings (`client_with(batch_waiting=3)`)."""
    servers = []

    def serve(**changes: Any) -> openai.OpenAI:
        server = make_server("127.0.0.1", 0, make_app(settings.model_copy(update=changes)), threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return sdk(f"http://127.0.0.1:{server.server_port}")

    yield serve
    for server in servers:
        server.shutdown()


def jsonl(*lines: Any) -> bytes:
    return b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)


def submit(client, data: bytes, endpoint: str = "/v1/chat/completions", **kw: Any):  # type: ignore[no-untyped-def]
    source = client.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch")
    return client.batches.create(input_file_id=source.id, endpoint=endpoint, completion_window="24h", **kw)


def by_custom_id(client, file_id: str | None) -> dict[str, dict[str, Any]]:  # type: ignore[no-untyped-def]
    if file_id is None:
        return {}
    lines = [json.loads(line) for line in client.files.content(file_id).text.splitlines()]
    return {line["custom_id"]: line for line in lines}


def test_a_batch_answers_every_good_line_and_names_every_bad_one_by_custom_id(client, start_worker, store):
    # Given a file of four good requests and six that cannot be run
    good = [chat_line(f"ok-{n}", f"line {n}") for n in range(4)]
    data = jsonl(
        good[0],
        b"{not json",
        good[1],
        {**chat_line("elsewhere"), "url": "/v1/embeddings"},
        {**chat_line("x"), "custom_id": None},
        good[2],
        chat_line("ok-0"),  # the same custom_id again
        {**chat_line("no-model"), "body": {**chat_line("")["body"], "model": "nope"}},
        chat_line("streamed", stream=True),
        good[3],
    )
    start_worker()

    # When it runs as a batch
    batch = submit(client, data, metadata={"run": "nightly"})
    assert batch.status in ("in_progress", "finalizing", "completed") and batch.metadata == {"run": "nightly"}
    done = wait_batch(store, batch.id)

    # Then every line has exactly one result, the good ones the endpoint's own answer
    final = client.batches.retrieve(batch.id)
    assert (final.status, done.status) == ("completed", "completed")
    assert (final.request_counts.total, final.request_counts.completed, final.request_counts.failed) == (10, 4, 6)
    assert final.completed_at and final.finalizing_at and final.in_progress_at and final.expires_at > final.created_at
    output, errors = by_custom_id(client, final.output_file_id), by_custom_id(client, final.error_file_id)
    assert sorted(output) == ["ok-0", "ok-1", "ok-2", "ok-3"]
    for n in range(4):
        line = output[f"ok-{n}"]
        response = line["response"]
        job = store.get(response["request_id"])
        assert job.id == job_id_of(batch.id, [0, 2, 5, 9][n]) and job.spec.priority == "batch"
        assert response["status_code"] == 200 and line["error"] is None and line["id"].startswith("batch_req_")
        body = response["body"]
        assert body["object"] == "chat.completion" and body["service_tier"] == "flex"
        assert body["choices"][0]["message"]["content"] == job.output and body["usage"]["completion_tokens"] == 4
    assert errors["elsewhere"]["error"]["code"] == "invalid_url"
    assert errors["no-model"]["error"]["code"] == "model_not_found"
    assert errors["streamed"]["error"]["code"] == "invalid_body"
    assert errors["ok-0"]["error"]["code"] == "duplicate_custom_id"  # (the first ok-0 is in the output)
    nameless = [
        line for line in client.files.content(final.error_file_id).text.splitlines() if '"custom_id": null' in line
    ]
    assert sorted(json.loads(x)["error"]["code"] for x in nameless) == ["invalid_json", "missing_custom_id"]

    # And what the batch kept in Redis while it ran is gone; its record lives as long as its files
    assert not store.redis.exists(
        *(k(batch.id) for k in (keys.batch_lines, keys.batch_running, keys.batch_output, keys.batch_errors))
    )
    assert 0 < store.redis.ttl(keys.batch(batch.id)) <= store.settings.file_retention_s
    assert not store.redis.zscore(keys.BATCHES, batch.id)
    assert store.list(store.get(job_id_of(batch.id, 0)).owner) == []  # its jobs are not listed one by one


@pytest.mark.parametrize(
    "endpoint, body, obj",
    [
        ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 3}, "text_completion"),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 3, "instructions": "Be brief."}, "response"),
    ],
)
def test_each_endpoint_answers_in_its_own_shape(client, start_worker, store, endpoint, body, obj):
    start_worker()
    line = {"custom_id": "a", "method": "POST", "url": endpoint, "body": {"model": MODEL, "temperature": 0, **body}}
    batch = submit(client, jsonl(line), endpoint=endpoint)
    done = wait_batch(store, batch.id)
    answer = by_custom_id(client, done.output_file_id)["a"]["response"]["body"]
    job = store.get(job_id_of(batch.id, 0))
    assert answer["object"] == obj and done.error_file_id is None
    text = answer["output"][0]["content"][0]["text"] if obj == "response" else answer["choices"][0]["text"]
    assert text == job.output != ""


def test_a_batch_feeds_the_queue_as_it_drains_outside_its_owners_quota(client_with, settings, store, start_worker):
    # Given a bound of 3 waiting lines per batch, and a quota of 2 waiting jobs per user
    own = client_with(batch_waiting=3, max_queued_per_user=2, max_batch=8, batch_share=1.0)

    # When a batch of 12 lines is created while no worker runs
    batch = submit(own, jsonl(*(chat_line(f"r{n}", tokens=2) for n in range(12))))

    # Then only 3 of its lines wait in the queue, none refused by the quota; the owner still has their own quota
    assert store.redis.zcard(keys.QUEUE) == 3 and store.redis.llen(keys.batch_lines(batch.id)) == 9
    assert own.batches.retrieve(batch.id).request_counts.failed == 0
    mine = [own.responses.create(model=MODEL, input="mine", background=True, max_output_tokens=2) for _ in range(2)]
    assert [r.status for r in mine] == ["queued", "queued"]
    with pytest.raises(openai.RateLimitError):  # (the quota still binds what the owner sends themself)
        own.responses.create(model=MODEL, input="one too many", background=True, max_output_tokens=2)

    # And once a worker runs, every line is answered, and the owner's own jobs too
    start_worker()
    done = wait_batch(store, batch.id)
    assert (done.status, done.completed, done.failed) == ("completed", 12, 0)
    for r in mine:
        wait_ended(store, "job_" + r.id.removeprefix("resp_"))


def test_the_batches_hold_at_most_their_share_of_the_slots(client_with, store):
    # Given slots for 8 jobs (no worker live yet: ONELANE_MAX_BATCH counts), of which batches may hold half
    own = client_with(max_batch=8, batch_share=0.5)

    # When two batches are created
    first = submit(own, jsonl(*(chat_line(f"a{n}") for n in range(6))))
    second = submit(own, jsonl(*(chat_line(f"b{n}") for n in range(6))))

    # Then 4 of their lines are in the queue, the first batch's before the second's, and 4 places stay free
    assert store.redis.zcard(keys.QUEUE) == 4
    assert store.redis.hlen(keys.batch_running(first.id)) == 4 and store.redis.hlen(keys.batch_running(second.id)) == 0
    assert own.batches.retrieve(second.id).status == "in_progress"


def test_line_breaks_json_leaves_unescaped_split_neither_an_input_line_nor_a_result_line(client, start_worker, store):
    # Given a file whose custom_ids and prompts hold U+2028, U+2029 and U+0085 unescaped, as
    # json.dumps(..., ensure_ascii=False) writes them: valid JSON, and breaks to str.splitlines()
    names = ["line\u2028sep", "para\u2029sep", "next\x85line"]
    data = b"".join(json.dumps(chat_line(name, f"say {name}"), ensure_ascii=False).encode() + b"\n" for name in names)
    assert len(data.decode().splitlines()) == 9  # (each name twice a line)
    start_worker()

    # When it runs as a batch
    batch = submit(client, data)
    wait_batch(store, batch.id)

    # Then each line ran, and its result is one line however it is read
    final = client.batches.retrieve(batch.id)
    assert (final.request_counts.completed, final.request_counts.failed) == (3, 0)
    results = client.files.content(final.output_file_id).text
    assert results.splitlines() == results.removesuffix("\n").split("\n")
    assert sorted(by_custom_id(client, final.output_file_id)) == sorted(names)


def test_cancel_keeps_what_completed_and_ends_every_other_line_once(client, start_worker, store):
    # Given a worker running a batch's second line, the first one completed
    start_worker()
    lines = [chat_line("first", tokens=3), chat_line("long", tokens=BUSY)] + [chat_line(f"later-{n}") for n in range(3)]
    batch = submit(client, jsonl(*lines))
    wait_ended(store, job_id_of(batch.id, 0))
    wait_event(store, job_id_of(batch.id, 1), lambda e: e.type == "token")

    # When the batch is cancelled (twice)
    cancelling = client.batches.cancel(batch.id)
    again = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and again.status in ("cancelling", "cancelled")
    done = wait_batch(store, batch.id)

    # Then what completed is in the output file, every other line in the error file, once
    final = client.batches.retrieve(batch.id)
    assert (final.status, final.request_counts.completed, final.request_counts.failed) == ("cancelled", 1, 4)
    assert final.cancelling_at and final.cancelled_at and done.status == "cancelled"
    assert list(by_custom_id(client, final.output_file_id)) == ["first"]
    errors = by_custom_id(client, final.error_file_id)
    assert sorted(errors) == ["later-0", "later-1", "later-2", "long"]
    assert {e["error"]["code"] for e in errors.values()} == {"batch_cancelled"}
    long_job = store.get(job_id_of(batch.id, 1))
    assert long_job.status is JobStatus.CANCELLED and long_job.output != ""  # stopped where it was
    assert client.batches.cancel(batch.id).status == "cancelled"  # cancelling an ended batch changes nothing


def test_a_batch_past_its_window_expires_each_line_not_answered(client_with, store):
    # Given no worker, When a batch's window (1 s here) ends
    own = client_with(batch_window_s=1.0)
    batch = submit(own, jsonl(chat_line("a"), chat_line("b")))
    done = wait_batch(store, batch.id)

    # Then it expired, and each line is in the error file, once
    assert (done.status, done.completed, done.failed) == ("expired", 0, 2) and done.expired_at
    errors = [json.loads(x) for x in own.files.content(done.error_file_id).text.splitlines()]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("a", "batch_expired"), ("b", "batch_expired")]
    assert BatchStore(store.redis, store.settings).active() == [] and store.redis.zcard(keys.QUEUE) == 0


def test_a_file_with_no_json_object_makes_a_failed_batch(client):
    batch = submit(client, b"this is not\nJSON lines\n")
    assert batch.status == "failed" and batch.errors.data[0].code == "invalid_file"
    assert batch.request_counts.total == 0 and client.batches.retrieve(batch.id).status == "failed"


def test_batches_are_listed_newest_first_and_seen_by_their_owner_only(client, live_server, store):
    first = submit(client, jsonl(chat_line("a")))
    second = submit(client, jsonl(chat_line("b")))
    listed = client.batches.list(limit=1)
    assert [b.id for b in listed.data] == [second.id] and listed.has_more
    assert [b.id for b in client.batches.list(after=second.id).data] == [first.id]
    batches = BatchStore(store.redis, store.settings)
    record = batches.get(first.id)
    other = "someone-else"
    from tasks.errors import BatchNotFound

    with pytest.raises(BatchNotFound):
        batches.get(first.id, other)
    with pytest.raises(BatchNotFound):
        batches.cancel(first.id, other)
    assert batches.list(other, 10) == ([], False) and record.owner != other


@pytest.mark.parametrize(
    "change, param",
    [
        ({"endpoint": "/v1/moderations"}, "endpoint"),
        ({"completion_window": "48h"}, "completion_window"),
        ({"input_file_id": "file-nope"}, "input_file_id"),
        ({"metadata": {str(n): "v" for n in range(17)}}, "metadata"),
        ({"tools": []}, "tools"),
        ({"output_expires_after": {"anchor": "created_at", "seconds": 60}}, "output_expires_after.seconds"),
        ({"output_expires_after": {"anchor": "completed_at", "seconds": 3600}}, "output_expires_after.anchor"),
    ],
)
def test_a_batch_that_cannot_be_is_refused_naming_the_field(client, change, param):
    source = client.files.create(file=("r.jsonl", io.BytesIO(jsonl(chat_line("a")))), purpose="batch")
    body = {"input_file_id": source.id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **change}
    with pytest.raises((openai.BadRequestError, openai.NotFoundError)) as caught:
        client.post("/batches", body=body, cast_to=object)
    assert caught.value.body["param"] == param  # type: ignore[index]


def test_too_many_lines_are_refused_before_anything_runs(client_with, store):
    own = client_with(max_batch_lines=2)
    with pytest.raises(openai.BadRequestError) as caught:
        submit(own, jsonl(*(chat_line(str(n)) for n in range(3))))
    assert "ONELANE_MAX_BATCH_LINES" in caught.value.message and caught.value.body["param"] == "input_file_id"
    assert store.redis.zcard(keys.BATCHES) == 0 and store.redis.zcard(keys.QUEUE) == 0


def test_output_expires_after_keeps_the_result_files_that_long_after_they_are_written(client, start_worker, store):
    # Given a batch of a good line and a bad one, whose results are to be kept an hour
    start_worker()
    bad = {**chat_line("no-model"), "body": {**chat_line("")["body"], "model": "nope"}}
    batch = submit(client, jsonl(chat_line("ok"), bad), output_expires_after={"anchor": "created_at", "seconds": 3600})

    # When it ended, Then its output and error files expire an hour after they were written
    done = wait_batch(store, batch.id)
    for file_id in (done.output_file_id, done.error_file_id):
        made = client.files.retrieve(file_id)  # type: ignore[arg-type]
        assert made.expires_at - made.created_at == 3600
        assert 0 < min(store.redis.ttl(keys.file(file_id)), store.redis.ttl(keys.file_data(file_id))) <= 3600
    # And the batch itself is kept as long as any file is
    assert store.redis.ttl(keys.batch(batch.id)) > store.settings.file_retention_s - 60


def test_lines_of_a_model_that_failed_to_load_end_with_its_error(client, store):
    # Given the demo model failed to load (as a worker records it), not tried again for a while
    store.for_worker("w").model_failed(MODEL, "the model failed to load (its files were not found)")

    # When a batch of its lines is created, Then each line ends at once with the model's error, as its jobs would
    done = wait_batch(store, submit(client, jsonl(chat_line("a"), chat_line("b"))).id)
    errors = by_custom_id(client, done.error_file_id)
    assert (done.status, done.completed, done.failed) == ("completed", 0, 2)
    assert {e["error"]["code"] for e in errors.values()} == {"model_unavailable"} and sorted(errors) == ["a", "b"]


def test_a_full_queue_makes_a_batch_wait_not_fail(client_with, store):
    own = client_with(max_queue=2, max_batch=8, batch_share=1.0)
    batch = submit(own, jsonl(*(chat_line(f"r{n}") for n in range(5))))
    assert store.redis.zcard(keys.QUEUE) == 2 and store.redis.llen(keys.batch_lines(batch.id)) == 3
    assert own.batches.retrieve(batch.id).request_counts.failed == 0
