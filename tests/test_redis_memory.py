"""Redis's memory stays within ONELANE_REDIS_MEMORY: new work (a job, a file, a batch) is refused with 503 and
Retry-After while Redis holds that much, work already admitted goes on, and new work is taken again once it has
room (tasks/store/memory.py)."""

from __future__ import annotations

import io
import time

import openai
import pytest

from tasks.settings import Settings
from tasks.store.memory import READ_EVERY_S

FILE = b'{"custom_id": "r", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n' * 40_000  # ~3 MB


@pytest.fixture
def settings(settings: Settings, redis_client) -> Settings:  # type: ignore[no-untyped-def]
    # a bound 12 MB above what the story's Redis holds now (the images' own bounds below it, as start-up demands)
    used = int(redis_client.info("memory")["used_memory"])
    return Settings(
        **{
            **settings.model_dump(),
            "redis_memory_bytes": max(used + 12 * 2**20, 16 * 2**20),
            "image_max_bytes": 2**20,
            "image_user_bytes": 2**20,
            "image_total_bytes": 2**20,
        }
    )


def until_refused(upload, within_s: float = 10 * READ_EVERY_S):  # type: ignore[no-untyped-def]
    """Upload until the server says it is full (what Redis holds is read at most once a READ_EVERY_S)."""
    deadline = time.monotonic() + within_s
    made = []
    while time.monotonic() < deadline:
        try:
            made.append(upload())
        except openai.InternalServerError as refused:
            return made, refused
    raise AssertionError(f"{len(made)} uploads and none refused")


def test_uploads_stop_at_the_bound_and_are_taken_again_once_there_is_room(live_server, store):
    client = openai.OpenAI(base_url=f"{live_server}/v1", api_key="x", max_retries=0)
    # When files are uploaded as fast as a client can until the server's store is full
    made, refused = until_refused(lambda: client.files.create(file=("f.jsonl", io.BytesIO(FILE)), purpose="batch"))
    # Then the upload is a 503 saying why, with Retry-After
    assert refused.status_code == 503 and refused.response.headers["Retry-After"].isdigit()
    assert refused.code == "storage_full" and "ONELANE_REDIS_MEMORY" in refused.message
    # and Redis holds no more than the bound and one request more, although Redis's own figure is read at most once
    # a second: each upload was counted as it was taken (the connections' query buffers of the last uploads count in
    # Redis's figure until its cron frees them: seconds, on a loaded machine)
    most, deadline = store.settings.redis_memory_bytes + 1.5 * len(FILE), time.monotonic() + 10
    while (used := store.redis.info("memory")["used_memory"]) > most and time.monotonic() < deadline:
        time.sleep(0.1)  # a poll: Redis announces no buffer it frees
    assert len(made) >= 2 and used <= most, (len(made), used, most)
    # When the files are deleted, Then an upload is taken again
    for file in made:
        client.files.delete(file.id)
    assert until_taken(lambda: client.files.create(file=("f.jsonl", io.BytesIO(FILE)), purpose="batch"))


def test_jobs_wait_while_redis_is_full_and_those_admitted_go_on(jobs, store):
    # Given a job admitted before Redis filled up (no worker: it waits)
    before = jobs.submit("hello")
    # When Redis holds more than its bound (the operator's own keys, or ours)
    store.redis.set("someone-elses-key", b"x" * (14 * 2**20), ex=300)
    # Then a new job is a 503 saying why, with Retry-After, and the job admitted before still waits
    deadline = time.monotonic() + 10 * READ_EVERY_S
    while (answer := jobs.client.post("/v1/jobs", json={"prompt": "one more"})).status_code != 503:
        assert time.monotonic() < deadline, "still admitted past the bound"
        jobs.cancel(answer.get_json()["id"])  # (admitted on Redis's figure of up to a second before: not the story's)
    assert answer.get_json()["error"]["type"] == "storage_full" and answer.headers["Retry-After"].isdigit()
    assert jobs.get(before["id"])["status"] == "queued"
    # When Redis has room again, Then jobs are admitted again
    store.redis.delete("someone-elses-key")
    assert until_taken(lambda: jobs.submit("again"))


def until_taken(submit, within_s: float = 10 * READ_EVERY_S):  # type: ignore[no-untyped-def]
    """Submit until the server takes it again (it reads what Redis holds at most once a READ_EVERY_S)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            return submit()
        except (openai.InternalServerError, AssertionError):
            continue
    raise AssertionError("still refused once Redis had room")
