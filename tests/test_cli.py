"""The real `onelane worker` process, as users start it, runs jobs admitted through the web."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import wait_ended


def test_onelane_worker_process_runs_a_job_with_one_thread_and_prefetch_one(jobs, store, settings, tmp_path):
    env = {
        **os.environ,
        "REDIS_URL": settings.effective_redis_url,
        "ONELANE_MODEL": settings.model_path,
        "ONELANE_VAR_DIR": str(tmp_path),
    }
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        worker = subprocess.Popen([sys.executable, "-m", "tasks.cli", "worker"], env=env, stdout=out, stderr=out)
    try:
        job = jobs.submit("through the cli", max_tokens=6, ignore_eos=True)
        done = wait_ended(store, job["id"], timeout_s=60)
        assert done["status"] == "completed"
        assert done["usage"]["completion_tokens"] == 6
    finally:
        worker.terminate()
        assert worker.wait(timeout=30) == 0
    text = log.read_text()
    assert "(1 process, 1 thread, prefetch 1)" in text
    assert "Traceback" not in text


def test_the_worker_runs_with_openblas_preloaded_on_linux(store, worker_process):
    import pytest

    from tests.test_recovery import wait_for_worker
    from worker.blas import openblas_path

    library = openblas_path()
    if library is None:
        assert not (sys.platform.startswith("linux") and os.environ.get("CI")), "./dev.sh installs OpenBLAS on Linux"
        pytest.skip("no OpenBLAS on this machine")
    worker_process()
    pid = wait_for_worker(store).pid
    with open(f"/proc/{pid}/maps") as maps:
        assert os.path.realpath(library) in maps.read()


def test_redis_worker_and_web_started_apart_find_each_other(tmp_path, demo_model, make_app):
    from tasks.settings import Settings
    from tasks.store import Store, connect

    # Given only ONELANE_VAR_DIR shared, and no REDIS_URL anywhere
    env = {**{k: v for k, v in os.environ.items() if k != "REDIS_URL"},
           "ONELANE_VAR_DIR": str(tmp_path / "var"), "ONELANE_MODEL": str(demo_model)}  # fmt: skip
    redis_server = subprocess.Popen([sys.executable, "-m", "tasks.cli", "redis"], env=env, stdout=subprocess.PIPE,
                                    text=True)  # fmt: skip
    worker = None
    try:
        announced = redis_server.stdout.readline().strip()  # type: ignore[union-attr]
        settings = Settings.from_env(env)
        assert announced == f"REDIS_URL={settings.effective_redis_url}"
        worker = subprocess.Popen([sys.executable, "-m", "tasks.cli", "worker", "--no-supervise"], env=env)

        # When the web (built from the same environment) admits a job
        response = make_app(settings).test_client().post("/v1/jobs", json={"prompt": "apart", "max_tokens": 3})
        assert response.status_code == 202

        # Then the worker, which found the same Redis, runs it
        store = Store(connect(settings.effective_redis_url), settings)
        assert wait_ended(store, response.get_json()["id"], timeout_s=60)["status"] == "completed"
    finally:
        for process in (worker, redis_server):
            if process is not None:
                process.terminate()
                process.wait(timeout=30)
    # `onelane redis`, stopped, took its server with it
    assert not (tmp_path / "var" / "redis" / "redis.sock").exists()
