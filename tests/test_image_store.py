"""The image bytes Redis keeps (issue 60, items 3 and 5): only an admitted job's, written as it is admitted; while a
job holding it may run, or a completed one's follow-up may resend it; bounded per user and in all; gone when no job
needs it. And a prompt's images are counted with its history's, however the history comes.

The jobs run nowhere: the stories play the worker (claim, finish) through the worker's own store verbs, so that
what ends a job is what ends it in production (tasks/lua/finish.lua, cancel.lua).
"""

from __future__ import annotations

import base64
import hashlib
import io
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from PIL import Image

from tasks.job import JobStatus
from tasks.settings import Settings
from tasks.store import Store
from tests.helpers import claim_now
from tests.test_hostile_models import serve
from tests.test_image_urls import vision_folder

pytestmark = pytest.mark.timeout(180)

MiB = 2**20


def noise(side: int, seed: int) -> bytes:
    """A PNG of side x side random pixels: about 3 x side² bytes, however it is compressed."""
    pixels = random.Random(seed).randbytes(side * side * 3)
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), pixels).save(out, "PNG", compress_level=1)
    return out.getvalue()


def image_parts(*images: bytes, text: str = "What is this?") -> list[dict[str, Any]]:
    urls = [f"data:image/png;base64,{base64.b64encode(i).decode()}" for i in images]
    return [{"type": "image_url", "image_url": {"url": u}} for u in urls] + [{"type": "text", "text": text}]


def image_keys(client: redis.Redis) -> list[str]:
    return sorted(str(k) for pattern in ("onelane:image*", "onelane:user-image*") for k in client.keys(pattern))


@pytest.fixture
def web(settings: Settings, demo_model: Path, tmp_path: Path, make_app, redis_client):  # type: ignore[no-untyped-def]
    """Start a live web with the image settings a story gives, serving "chat" and "eyes" (its processor's images
    1024 x 1024: the stories' images are kept as they come); returns its URL and a store of the same settings."""
    from werkzeug.serving import make_server

    servers = []

    def start(**update: Any) -> tuple[str, Store]:
        served, _ = serve(
            settings.model_copy(update=update),
            tmp_path,
            chat={"path": str(demo_model), "default": True},
            eyes={"path": str(vision_folder(tmp_path, 1024))},
        )
        server = make_server("127.0.0.1", 0, make_app(served), threaded=True)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}", Store(redis_client, served)

    yield start
    for server in servers:
        server.shutdown()


def submitter(base: str) -> Callable[..., requests.Response]:
    def submit(content: Any, model: str = "eyes", **fields: Any) -> requests.Response:
        body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **fields}
        return requests.post(f"{base}/v1/jobs", json=body, timeout=60)

    return submit


def run_to_end(store: Store, status: JobStatus = JobStatus.COMPLETED) -> str:
    """Play the worker: claim the next job in fair order and end it `status`; its id."""
    worker = store.for_worker("w")
    assert worker.take_device() == "ok"
    job = claim_now(store, "w")
    assert job is not None
    error = ("worker_crashed", "it failed") if status is JobStatus.FAILED else None
    assert worker.finish(job.id, status, finish_reason="stop", error=error, completion_tokens=1)
    return job.id


def test_ten_refused_image_requests_leave_redis_as_it_was(web, redis_client):
    # Given a user whose quota of waiting jobs is full (one job waits)
    base, _ = web(max_queued_per_user=1)
    submit = submitter(base)
    assert submit("a question", model="chat").status_code == 202
    pictures = [noise(1600, seed) for seed in range(10)]  # 7.7 MB each: 77 MB in all
    assert all(7 * MiB < len(p) < 8 * MiB for p in pictures)
    before, data_before = used(redis_client), dataset(redis_client)
    # When ten requests come, each with an image
    for picture in pictures:
        reply = submit(image_parts(picture))
        # Then each is refused, 429
        assert reply.status_code == 429 and reply.json()["error"]["type"] == "quota_exceeded", reply.text
    # and Redis holds what it held: no image, and its memory (all of it, and what its keys take) within 1 MiB once it
    # has let go of the buffer the last request's bytes came in (its client cron frees an idle client's within a few
    # seconds) (the review measured +100 MiB for 1,500 s)
    assert image_keys(redis_client) == []
    deadline = time.monotonic() + 15

    def grown() -> tuple[int, int]:
        return used(redis_client) - before, dataset(redis_client) - data_before

    while max(map(abs, grown())) >= MiB and time.monotonic() < deadline:
        time.sleep(0.2)  # (a poll: Redis tells nobody when its cron frees a buffer)
    assert max(map(abs, grown())) < MiB, (grown(), redis_client.info("memory").get("mem_clients_normal"))


def used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def dataset(client: redis.Redis) -> int:
    """What Redis keeps of its keys and values (its memory less its own overhead: clients' buffers, scripts...)."""
    return int(client.info("memory")["used_memory_dataset"])


def test_a_jobs_images_go_when_it_ends_and_no_other_job_needs_them(web, redis_client):
    # Given no image kept for a follow-up (ONELANE_IMAGE_KEEP 0), two jobs holding the same image, a third another
    base, store = web(image_keep_s=0)
    submit = submitter(base)
    red, blue = noise(64, 1), noise(64, 2)
    first, second, third = (submit(image_parts(p)).json() for p in (red, red, blue))
    red_key, blue_key = (f"onelane:image:{j['messages'][0]['images'][0]['digest']}" for j in (first, third))
    assert store.image(red_key.rsplit(":", 1)[1]) == red and store.image(blue_key.rsplit(":", 1)[1]) == blue
    # When the first is cancelled as it waits, Then its image stays: the second holds it
    assert requests.delete(f"{base}/v1/jobs/{first['id']}", timeout=30).status_code == 200
    assert redis_client.exists(red_key)
    # When the second runs and completes, Then its image goes
    assert run_to_end(store) == second["id"]
    assert not redis_client.exists(red_key) and redis_client.exists(blue_key)
    # When the third runs and fails, Then its image goes, and no record of any image is left
    assert run_to_end(store, JobStatus.FAILED) == third["id"]
    assert image_keys(redis_client) == []


def test_a_completed_jobs_image_is_kept_for_its_follow_up_and_then_goes(web, redis_client):
    from web.conversation import follow_up

    # Given a completed job about an image, its images kept 600 s for a follow-up
    base, store = web(image_keep_s=600)
    submit = submitter(base)
    job = submit(image_parts(noise(64, 3))).json()
    key = f"onelane:image:{job['messages'][0]['images'][0]['digest']}"
    run_to_end(store)
    # Then its image is kept, 600 s at most
    assert 0 < redis_client.ttl(key) <= 600
    # When the page continues it (the follow-up resends the image from the server's record, without its bytes)
    spec, ttl_s = follow_up(store.get(job["id"]), "And its color?", store.settings)
    assert spec.messages is not None and spec.messages[0].images[0].data is None
    follow = store.admit("job_follow", spec, ttl_s)
    # Then it is admitted, and holds the image as long as it may wait and run
    assert follow.status is JobStatus.QUEUED and redis_client.ttl(key) > 600
    # When the follow-up is cancelled, Then the image is kept for the first job's follow-ups still
    store.cancel("job_follow", spec.owner)
    assert 0 < redis_client.ttl(key) <= 600
    # and with no image kept after a job (ONELANE_IMAGE_KEEP 0), a follow-up is refused at the door, by name
    base, store = web(image_keep_s=0)
    job = submitter(base)(image_parts(noise(64, 4))).json()
    run_to_end(store)
    spec, ttl_s = follow_up(store.get(job["id"]), "And its color?", store.settings)
    from tasks.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="no longer kept"):
        store.admit("job_late", spec, ttl_s)


def test_a_users_image_bytes_are_bounded(web, redis_client):
    # Given a bound of 1.5 MiB of images a user (0.6 MB an image)
    base, store = web(image_user_bytes=int(1.5 * MiB), image_max_bytes=MiB, image_keep_s=600)
    submit = submitter(base)
    pictures = [noise(450, seed) for seed in range(4)]
    assert all(0.55 * MiB < len(p) < 0.6 * MiB for p in pictures)
    assert submit(image_parts(pictures[0])).status_code == 202
    assert submit(image_parts(pictures[1])).status_code == 202
    # When a third image would take the user past it, Then it is refused, 429, to try again later
    third = submit(image_parts(pictures[2]))
    assert third.status_code == 429 and "ONELANE_IMAGE_USER_BYTES" in third.json()["error"]["message"], third.text
    assert int(third.headers["Retry-After"]) >= 1
    # and a request whose images alone are past it, 413: it never fits
    alone = submit(image_parts(*pictures[1:4]))
    assert alone.status_code == 413, alone.text
    # When the first job completes (its image is then kept for a follow-up only), Then the third is admitted, and
    # the image kept for a follow-up only makes room for it
    run_to_end(store)
    assert submit(image_parts(pictures[2])).status_code == 202
    kept = {k.rsplit(":", 1)[1] for k in image_keys(redis_client) if k.startswith("onelane:image:")}
    digests = {hashlib.sha256(p).hexdigest() for p in pictures}
    assert len(kept & digests) == 2


def test_a_conversation_continued_by_the_server_counts_its_history_images(web, redis_client):
    # Given a server taking at most 2 images a prompt, and a completed response about two images
    base, store = web(max_images=2)
    first = {
        "model": "eyes",
        "background": True,
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": f"data:image/png;base64,{base64.b64encode(p).decode()}"}
                    for p in (noise(32, 5), noise(32, 6))
                ]
                + [{"type": "input_text", "text": "Which is larger?"}],
            }
        ],
    }
    response = requests.post(f"{base}/v1/responses", json=first, timeout=30)
    assert response.status_code == 200, response.text
    run_to_end(store)
    # When it is continued with a third image (previous_response_id: its two images come from the server's record)
    image = f"data:image/png;base64,{base64.b64encode(noise(32, 7)).decode()}"
    more = {
        "model": "eyes",
        "previous_response_id": response.json()["id"],
        "input": [{"role": "user", "content": [{"type": "input_image", "image_url": image}]}],
        "background": True,
    }
    reply = requests.post(f"{base}/v1/responses", json=more, timeout=30)
    # Then it is refused: the prompt would hold three (16 reached one prompt past a bound of 4)
    assert reply.status_code == 400, reply.text
    assert "the prompt holds 3 images (its history's too)" in reply.json()["error"]["message"]
    # while one with text only goes on
    text = more | {"input": [{"role": "user", "content": "And now?"}]}
    assert requests.post(f"{base}/v1/responses", json=text, timeout=30).status_code == 200
