"""OpenAI's Files API (the Batch API's input), with the official SDK: upload JSONL, read it back, list, delete; each
file kept for its retention, seen by its owner only, refused in words when it cannot be one."""

from __future__ import annotations

import io
import json

import openai
import pytest

from tasks import keys
from tasks.errors import FileNotFound
from tasks.files import FileStore

LINES = b"".join(
    json.dumps(
        {
            "custom_id": f"r{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        }
    ).encode()
    + b"\n"
    for n in range(3)
)


def test_an_uploaded_file_reads_back_byte_for_byte_until_deleted(client, store):
    # Given a JSONL file uploaded for a batch
    made = client.files.create(file=("requests.jsonl", io.BytesIO(LINES)), purpose="batch")

    # Then it is listed and reads back as it was sent, and its keys expire with its retention
    assert (made.object, made.purpose, made.bytes, made.filename) == ("file", "batch", len(LINES), "requests.jsonl")
    assert client.files.retrieve(made.id).bytes == len(LINES)
    assert client.files.content(made.id).content == LINES
    assert made.id in [f.id for f in client.files.list()]
    retention = store.settings.file_retention_s
    assert (
        0 < store.redis.ttl(keys.file(made.id)) <= retention
        and 0 < store.redis.ttl(keys.file_data(made.id)) <= retention
    )
    assert made.expires_at - made.created_at == retention

    # When it is deleted, Then it is gone, with its keys
    assert client.files.delete(made.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(made.id)
    assert not store.redis.exists(keys.file(made.id), keys.file_data(made.id))


def test_another_owners_file_is_not_found(store):
    files = FileStore(store.redis, store.settings)
    mine = files.create("alice", "a.jsonl", "batch", LINES)
    with pytest.raises(FileNotFound):
        files.get(mine.id, "bob")
    with pytest.raises(FileNotFound):
        files.content(mine.id, "bob")
    with pytest.raises(FileNotFound):
        files.delete(mine.id, "bob")
    assert files.list("bob", 10) == ([], False) and files.content(mine.id, "alice") == LINES


def test_the_sdk_walks_every_file_once_a_page_at_a_time_in_either_order(client):
    # Given five files uploaded one after the other
    made = [client.files.create(file=(f"{n}.jsonl", io.BytesIO(LINES)), purpose="batch").id for n in range(5)]

    # Then the SDK's auto-pagination, two a page, walks each once: newest first, or oldest with order=asc
    assert [f.id for f in client.files.list(limit=2)] == made[::-1]
    assert [f.id for f in client.files.list(limit=2, order="asc")] == made
    page = client.files.list(limit=2, after=made[3])
    assert ([f.id for f in page.data], page.has_more) == (made[2:0:-1], True)
    assert [f.id for f in client.files.list(purpose="batch_output")] == []

    # And a client that deletes each file as it lists them deletes them all
    for listed in client.files.list(limit=2):
        client.files.delete(listed.id)
    assert list(client.files.list()) == []


@pytest.mark.parametrize("query, param", [({"order": "sideways"}, "order"), ({"after": "file-nope"}, "after")])
def test_a_listing_that_cannot_be_is_refused_naming_the_parameter(client, query, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.get("/files", cast_to=object, options={"params": query})
    assert refused.value.body["param"] == param  # type: ignore[index]


@pytest.mark.parametrize(
    "purpose, data, param",
    [
        ("assistants", LINES, "purpose"),
        ("batch", b"", "file"),
        ("batch", b"\xff\xfe not text", "file"),
    ],
)
def test_what_cannot_be_a_batch_file_is_refused_naming_the_field(client, purpose, data, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("x.jsonl", io.BytesIO(data)), purpose=purpose)
    assert refused.value.body["param"] == param  # type: ignore[index]


@pytest.fixture
def settings(settings):  # type: ignore[no-untyped-def]
    return settings.model_copy(update={"max_file_bytes": 4096})


def test_a_file_over_the_limit_is_413_and_nothing_is_kept(client, store):
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("big.jsonl", io.BytesIO(b"{}\n" * 2000)), purpose="batch")
    assert refused.value.status_code == 413
    assert not store.redis.keys(keys.FILE_PREFIX + "*")
