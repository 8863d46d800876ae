"""A worker that dies, freezes or races another loses no job and never generates one twice."""

from __future__ import annotations

import os
import signal
import time

from tasks import keys
from tests.helpers import BUSY, openai_chunks, wait_ended, wait_event


def wait_for_worker(store, other_than: int | None = None, timeout_s: float = 60):  # type: ignore[no-untyped-def]
    """The live worker holding the device (optionally: not the process `other_than`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = [w for w in store.readings.snapshot().workers if w.pid != other_than]
        if workers:
            return workers[0]
        time.sleep(0.05)
    raise AssertionError("no worker took the device")


def events(store, job_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [e.type for e in store.events(job_id)]


def test_a_worker_killed_mid_generation_loses_nothing(jobs, store, worker_process):
    worker_process()
    long = jobs.submit("long", max_tokens=1500, ignore_eos=True)
    others = [jobs.submit(f"o{n}", max_tokens=5, ignore_eos=True) for n in range(3)]
    wait_event(store, long["id"], lambda e: e.type == "token")

    os.kill(wait_for_worker(store).pid, signal.SIGKILL)

    done = wait_ended(store, long["id"], timeout_s=60)
    assert done["status"] == "completed" and done["attempts"] == 2
    assert done["usage"]["completion_tokens"] == 1500
    assert events(store, long["id"]).count("requeued") == 1
    assert [wait_ended(store, o["id"])["status"] for o in others] == ["completed"] * 3
    assert int(store.redis.hget(keys.STATS, "worker_restarts")) == 1


def test_a_job_that_kills_the_worker_twice_is_quarantined(jobs, store, worker_process):
    worker_process()
    poison = jobs.submit("poison", max_tokens=6000, ignore_eos=True)
    after = jobs.submit("next", max_tokens=4, ignore_eos=True)

    for attempt in (1, 2):
        wait_event(store, poison["id"], lambda e: e.type == "token" and store.get(poison["id"]).attempts == attempt)
        os.kill(wait_for_worker(store).pid, signal.SIGKILL)

    failed = wait_ended(store, poison["id"], timeout_s=60)
    assert failed["status"] == "failed"
    assert failed["error"]["type"] == "worker_crashed"
    assert failed["attempts"] == 2
    assert wait_ended(store, after["id"], timeout_s=60)["status"] == "completed"


def test_two_workers_on_one_device_never_overlap_and_the_second_takes_over(jobs, store, worker_process):
    first = worker_process(supervise=False)
    holder = wait_for_worker(store)
    worker_process(supervise=False)  # waits for the device
    ids = [
        jobs.submit(f"j{n}", max_tokens=2500 if n == 3 else 30 if n < 3 else 600, ignore_eos=True)["id"]
        for n in range(6)
    ]
    for job_id in ids[:3]:
        wait_ended(store, job_id)
    wait_event(store, ids[3], lambda e: e.type == "token")  # the first worker is inside the fourth job

    first.send_signal(signal.SIGKILL)  # the standby takes the device once the lease lapses
    done = [wait_ended(store, job_id, timeout_s=60) for job_id in ids]

    assert all(d["status"] == "completed" for d in done)
    spans = sorted((d["timings"]["started_at"], d["timings"]["finished_at"]) for d in done)
    for (_, end), (next_start, _) in zip(spans, spans[1:]):
        assert end <= next_start, spans
    runners = {store.redis.hget(keys.job(job_id), "worker") for job_id in ids}
    assert len(runners) == 2 and holder.worker in runners


def test_a_frozen_worker_is_killed_and_its_job_runs_again(jobs, store, worker_process):
    worker_process()
    job = jobs.submit("frozen", max_tokens=1500, ignore_eos=True)
    wait_event(store, job["id"], lambda e: e.type == "token")

    frozen = wait_for_worker(store).pid
    os.kill(frozen, signal.SIGSTOP)  # alive but silent: its lease lapses, the supervisor kills it

    done = wait_ended(store, job["id"], timeout_s=60)
    # (the lapsed run counts only at a next hand-back, should its worker never wake: see tests/test_late_heartbeat.py)
    assert done["status"] == "completed" and done["attempts"] == 1
    assert wait_for_worker(store, other_than=frozen).pid != frozen


def test_a_job_that_stops_producing_tokens_fails_stalled_and_its_worker_is_killed(jobs, store, settings):
    import sys
    import threading

    from worker.supervisor import Supervisor

    stuck = jobs.submit("stuck", max_tokens=8)
    env = {
        **os.environ,
        "REDIS_URL": settings.effective_redis_url,
        "ONELANE_LEASE_S": "1",
        "ONELANE_MODEL": settings.model_path,
    }
    supervisor = Supervisor(
        settings.model_copy(update={"stall_s": 1.0, "lease_s": 1.0}),
        command=[sys.executable, "-m", "tests.stuck_worker"],
        env=env,
    )
    thread = threading.Thread(target=supervisor.run)
    thread.start()
    try:
        failed = wait_ended(store, stuck["id"], timeout_s=30)
        first = store.redis.hget(keys.job(stuck["id"]), "worker")
        deadline = time.monotonic() + 30
        while not store.redis.hget(keys.STATS, "worker_restarts"):
            assert time.monotonic() < deadline, "the stuck worker was never killed"
            time.sleep(0.05)
    finally:
        supervisor.stopping.set()
        thread.join()
    assert failed["status"] == "failed" and failed["error"]["type"] == "stalled"
    assert failed["usage"]["completion_tokens"] == 0 and first


def wait_ready(client, status: int, timeout_s: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while client.get("/readyz").status_code != status:
        assert time.monotonic() < deadline, f"/readyz never answered {status}"
        time.sleep(0.05)


def test_readyz_follows_the_worker(jobs, store, worker_process):
    first = worker_process()
    wait_ready(jobs.client, 200)

    # the active worker dies: the standby takes over within a fraction of a second, /readyz stays up
    os.kill(wait_for_worker(store).pid, signal.SIGKILL)
    wait_ready(jobs.client, 200)

    os.killpg(first.pid, signal.SIGKILL)  # the supervisor and both its workers: nothing serves now
    wait_ready(jobs.client, 503, timeout_s=5)
    body = jobs.client.get("/readyz").get_json()
    assert body["error"]["type"] == "unavailable" and body["workers"] == []

    worker_process()
    wait_ready(jobs.client, 200)


def test_a_watched_job_whose_worker_dies_runs_again_for_its_still_connected_client(
    jobs, store, worker_process, live_server
):
    from tests.helpers import EventStream

    worker_process()
    # (~5 s of work alone: 1.5 watch graces, then its worker's death, must leave it most of it still to run)
    job = jobs.submit("watched", max_tokens=6000, ignore_eos=True, abandon_on_disconnect=True)
    stream = EventStream(live_server, job["id"])
    seen = []
    grace = store.settings.watch_grace_s
    for item in stream:  # the job runs well past the watch grace before its worker dies
        seen.append(item.get("event"))
        started = store.get(job["id"]).timings.started_at
        if item.get("event") == "token" and started and time.time() - started > 1.5 * grace:
            break

    os.kill(wait_for_worker(store).pid, signal.SIGKILL)  # the active worker, not its supervisor
    seen += [item.get("event") for item in stream]

    done = store.get(job["id"])
    assert (done.status.value, done.attempts, done.usage.completion_tokens) == ("completed", 2, 6000)
    assert seen.count("requeued") == 1 and seen[-1] == "completed"


def test_an_openai_stream_goes_on_where_it_was_when_its_worker_dies(store, worker_process, live_server):
    import requests

    worker_process()
    body = {
        "model": store.settings.model_name,
        "messages": [{"role": "user", "content": "tell me"}],
        "stream": True,
        "max_tokens": 1500,
        "temperature": 0.9,
        "ignore_eos": True,
    }  # sampled, unseeded: its run is still its own
    content, finish, killed = "", None, False
    with requests.post(f"{live_server}/v1/chat/completions", json=body, stream=True, timeout=60) as response:
        job_id = response.headers["x-onelane-job-id"]
        for chunk in openai_chunks(response):
            content += chunk["choices"][0]["delta"].get("content") or ""
            finish = chunk["choices"][0]["finish_reason"] or finish
            if len(content) > 200 and not killed:
                os.kill(wait_for_worker(store).pid, signal.SIGKILL)  # mid-answer
                killed = True

    done = store.get(job_id)
    assert (done.status.value, done.attempts, finish) == ("completed", 2, "length")
    assert content == done.output and done.usage.completion_tokens == 1500


def test_a_background_response_stream_goes_on_numbered_alike_when_its_worker_dies(store, worker_process, live_server):
    import json

    import requests

    worker_process()
    body = {
        "model": store.settings.model_name,
        "input": "tell me",
        "stream": True,
        "background": True,
        "max_output_tokens": 1500,
        "temperature": 0.9,
        "ignore_eos": True,
    }
    events, killed = [], False
    with requests.post(f"{live_server}/v1/responses", json=body, stream=True, timeout=60) as response:
        job_id = response.headers["x-onelane-job-id"]
        for line in response.iter_lines(decode_unicode=True):
            if line.startswith("data: "):
                events.append(json.loads(line.removeprefix("data: ")))
                deltas = sum(1 for e in events if e["type"] == "response.output_text.delta")
                if deltas > 50 and not killed:
                    os.kill(wait_for_worker(store).pid, signal.SIGKILL)  # mid-answer
                    killed = True

    done = store.get(job_id)
    assert (done.status.value, done.attempts) == ("completed", 2) and events[-1]["type"] == "response.incomplete"
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == done.output
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    # a stream opened now, after the requeue, numbers the response's events as the one that lived through it
    rid = events[0]["response"]["id"]
    with requests.get(
        f"{live_server}/v1/responses/{rid}", params={"stream": "true", "starting_after": 40}, stream=True, timeout=60
    ) as again:
        later = [
            json.loads(line.removeprefix("data: "))
            for line in again.iter_lines(decode_unicode=True)
            if line.startswith("data: ")
        ]
    assert later == events[41:]


def start_web(settings, log_path, **more: str):  # type: ignore[no-untyped-def]
    """`onelane web` (gunicorn) on a free port, serving the workers' model; (process, base URL)."""
    import subprocess
    import sys

    from tests.conftest import free_port
    from tests.helpers import wait_answering

    port = free_port()
    env = {
        **os.environ,
        "REDIS_URL": settings.effective_redis_url,
        "ONELANE_MODEL": settings.model_path,
        "ONELANE_VAR_DIR": str(settings.var_dir),
        **more,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "web", "--port", str(port)],
        env=env,
        stdout=open(log_path, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_answering(f"http://127.0.0.1:{port}/healthz", process)
    return process, f"http://127.0.0.1:{port}"


def test_a_batch_through_a_worker_kill_and_a_web_restart_ends_every_line_exactly_once(
    store, settings, worker_process, tmp_path
):
    import io
    import json

    import openai

    from tasks.batches import job_id_of
    from tests.helpers import wait_batch

    # Given a worker and a web, running a batch of 10 lines
    worker_process()
    web, url = start_web(settings, tmp_path / "web-1.log", ONELANE_MAX_TOKENS_LIMIT=str(BUSY))
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)
    lines = [
        {
            "custom_id": f"r{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": settings.model_name,
                "messages": [{"role": "user", "content": f"line {n}"}],
                "max_tokens": 2500 if n == 3 else 20,
                "ignore_eos": True,
            },
        }
        for n in range(10)
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    source = client.files.create(file=("b.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")

    # When the worker is killed while it generates a line, and the web is killed and another one started
    wait_event(store, job_id_of(batch.id, 3), lambda e: e.type == "token")
    os.kill(wait_for_worker(store).pid, signal.SIGKILL)
    os.killpg(web.pid, signal.SIGKILL)
    web.wait()
    web, url = start_web(settings, tmp_path / "web-2.log", ONELANE_MAX_TOKENS_LIMIT=str(BUSY))
    try:
        done = wait_batch(store, batch.id, timeout_s=120)

        # Then every line ended once, completed, and only the line killed mid-answer ran twice
        assert (done.status, done.completed, done.failed) == ("completed", 10, 0)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)
        output = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
        assert sorted(o["custom_id"] for o in output) == sorted(f"r{n}" for n in range(10))
        jobs = store.read([job_id_of(batch.id, n) for n in range(10)])
        assert {job.status.value for job in jobs.values()} == {"completed"} and len(jobs) == 10
        assert [jobs[job_id_of(batch.id, n)].attempts for n in range(10)] == [1, 1, 1, 2, 1, 1, 1, 1, 1, 1]
        assert len(store.redis.keys(keys.JOB_PREFIX + "*")) == 10  # no line admitted twice under another id
        for o in output:
            job = jobs[o["response"]["request_id"]]
            assert o["response"]["body"]["choices"][0]["message"]["content"] == job.output
            assert events(store, job.id).count("started") == job.attempts
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        web.wait(timeout=30)


def test_a_batch_cancelled_while_its_killed_worker_is_replaced_ends_every_line_once(store, settings, worker_process):
    import io
    import json

    import openai

    from tasks.batches import job_id_of
    from tests.helpers import chat_line, wait_batch

    # Given a batch whose first line generates on a worker, When the worker is killed and the batch cancelled at once
    worker_process()
    web, url = start_web(settings, settings.var_dir / "web.log", ONELANE_MAX_TOKENS_LIMIT=str(BUSY))
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)
        lines = [chat_line(f"r{n}", tokens=BUSY, model=settings.model_name) for n in range(4)]
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        source = client.files.create(file=("b.jsonl", io.BytesIO(data)), purpose="batch")
        batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
        wait_event(store, job_id_of(batch.id, 0), lambda e: e.type == "started")  # (it runs until it is stopped)
        os.kill(wait_for_worker(store).pid, signal.SIGKILL)
        client.batches.cancel(batch.id)
        done = wait_batch(store, batch.id, timeout_s=120)

        # Then it ends cancelled, every line in the error file once, and none of its jobs is left waiting or running
        assert (done.status, done.completed + done.failed) == ("cancelled", 4)
        errors = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
        assert sorted(e["custom_id"] for e in errors) == ["r0", "r1", "r2", "r3"]
        assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
        assert all(s.ended for s in store.statuses([job_id_of(batch.id, n) for n in range(4)]).values() if s)
        assert store.redis.zcard(keys.QUEUE) == 0
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        web.wait(timeout=30)
