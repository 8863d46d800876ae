"""Redis goes away and comes back: the web answers 503 JSON meanwhile, and no admitted job is lost."""

from __future__ import annotations

import pytest

from tasks.embedded_redis import EmbeddedRedis
from tasks.store import Store
from tests.conftest import free_port
from tests.helpers import wait_ended


@pytest.fixture
def aof_redis(redis_server, tmp_path):  # type: ignore[no-untyped-def]
    """onelane's embedded set-up: AOF on, appendfsync everysec, on its own port so it can be restarted."""
    server = EmbeddedRedis(tmp_path / "aof", port=free_port(), appendonly=True).start()
    yield server
    server.stop()


@pytest.fixture
def settings(settings, aof_redis):  # type: ignore[no-untyped-def]
    return settings.model_copy(update={"redis_url": aof_redis.url})


@pytest.fixture
def store(settings):  # type: ignore[no-untyped-def]
    return Store.connect(settings)


def test_restarting_redis_mid_backlog_loses_no_job(jobs, store, aof_redis, worker_process, settings):
    worker_process()
    ids = [jobs.submit(f"j{n}", max_tokens=30, ignore_eos=True)["id"] for n in range(30)]
    wait_ended(store, ids[4])

    aof_redis.stop()
    down = jobs.client.post("/v1/jobs", json={"prompt": "while down"})
    assert down.status_code == 503
    assert down.get_json()["error"]["type"] == "unavailable"
    assert "Traceback" not in down.get_data(as_text=True)
    aof_redis.start()

    ids.append(jobs.submit("after", max_tokens=5, ignore_eos=True)["id"])  # the web recovered by itself
    fresh = Store.connect(settings)
    done = [wait_ended(fresh, job_id, timeout_s=90) for job_id in ids]
    assert [d["status"] for d in done] == ["completed"] * len(ids)
    assert all(d["usage"]["completion_tokens"] == d["params"]["max_tokens"] for d in done)
