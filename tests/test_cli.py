"""The real `onelane worker` process, as users start it, runs jobs admitted through the web."""

from __future__ import annotations

import os
import subprocess
import sys

from tasks.settings import Settings
from tests.conftest import with_shim
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
        worker = subprocess.Popen([sys.executable, "-m", "cli.main", "worker"], env=env, stdout=out, stderr=out)
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
    if not Settings.from_env().openblas:
        pytest.skip("ONELANE_OPENBLAS is off")
    worker_process()
    pid = wait_for_worker(store).pid
    with open(f"/proc/{pid}/maps") as maps:
        assert os.path.realpath(library) in maps.read()


def test_onelane_openblas_off_or_another_preload_leaves_the_worker_environment_alone():
    from worker.blas import worker_env

    assert "LD_PRELOAD" not in worker_env({"ONELANE_OPENBLAS": "false"})
    assert worker_env({"LD_PRELOAD": "/opt/other.so"})["LD_PRELOAD"] == "/opt/other.so"


def imported_by(*args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run `python -X importtime ARGS`: the finished process, and every module it imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    trace = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    return done, {line.rsplit("|", 1)[-1].strip() for line in trace}


def test_a_worker_process_reads_its_own_settings_without_the_cli():
    # Given a bad setting, so that a worker process stops once it has read its settings
    # When one starts as the supervisor starts it
    done, modules = imported_by("-m", "worker.main", ONELANE_LOG_LEVEL="loud")

    # Then it refuses the setting by name, with the worker's own imports done and the command line never imported
    assert done.returncode == 1 and "ONELANE_LOG_LEVEL='loud'" in done.stderr and "Traceback" not in done.stderr
    assert {"worker.batch.engine", "tasks.settings"} <= modules
    assert "cli" not in {m.split(".")[0] for m in modules}


def test_the_contract_imports_no_package_above_it_and_the_command_waits_to_import_the_processes_and_the_client():
    # Every module of tasks/: no arrow up into the command line, the processes built on the contract, or the client's
    # HTTP stack
    import pkgutil

    import cli
    import tasks

    every = ", ".join(f"tasks.{module.name}" for module in pkgutil.iter_modules(tasks.__path__))
    done, modules = imported_by("-c", f"import {every}")
    assert done.returncode == 0, done.stderr
    assert {"tasks.store", "tasks.settings"} <= modules
    assert not {m.split(".")[0] for m in modules} & {"cli", "web", "worker", "flask", "mlx", "requests", "rich"}

    # Every module of the command line: web/ and worker/ wait for the commands that start them
    every = ", ".join(f"cli.{module.name}" for module in pkgutil.iter_modules(cli.__path__))
    done, modules = imported_by("-c", f"import {every}")
    assert done.returncode == 0, done.stderr
    assert {"cli.main", "cli.client", "cli.url"} <= modules
    assert not {m.split(".")[0] for m in modules} & {"web", "worker", "flask", "mlx"}

    # The command alone: `onelane web` must let gevent patch ssl before the client's HTTP stack is imported
    done, modules = imported_by("-c", "import cli.main")
    assert done.returncode == 0, done.stderr
    assert {"cli.serve", "cli.models", "cli.jobs", "cli.chat", "cli.batch"} <= modules
    assert not {m.split(".")[0] for m in modules} & {"ssl", "requests", "urllib3", "rich", "redis"}


def test_redis_worker_and_web_started_apart_find_each_other(tmp_path, demo_model, make_app):
    from tasks.store import Store

    # Given only ONELANE_VAR_DIR shared, and no REDIS_URL anywhere
    env = {
        **{k: v for k, v in os.environ.items() if k != "REDIS_URL"},
        "ONELANE_VAR_DIR": str(with_shim(tmp_path / "var")),
        "ONELANE_MODEL": str(demo_model),
    }
    redis_server = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "redis"], env=env, stdout=subprocess.PIPE, text=True
    )
    worker = None
    try:
        announced = redis_server.stdout.readline().strip()  # type: ignore[union-attr]
        settings = Settings.from_env(env)
        assert announced == f"REDIS_URL={settings.effective_redis_url}"
        worker = subprocess.Popen([sys.executable, "-m", "cli.main", "worker", "--no-supervise"], env=env)

        # When the web (built from the same environment) admits a job
        response = make_app(settings).test_client().post("/v1/jobs", json={"prompt": "apart", "max_tokens": 3})
        assert response.status_code == 202

        # Then the worker, which found the same Redis, runs it
        store = Store.connect(settings)
        assert wait_ended(store, response.get_json()["id"], timeout_s=60)["status"] == "completed"
    finally:
        for process in (worker, redis_server):
            if process is not None:
                process.terminate()
                process.wait(timeout=30)
    # `onelane redis`, stopped, took its server with it
    assert not (tmp_path / "var" / "redis" / "redis.sock").exists()
