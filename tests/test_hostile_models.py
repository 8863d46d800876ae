"""A model that would kill the worker (issue 29) fails like any model that cannot load: its own waiting jobs fail
`model_unavailable` at once, not at their deadline, and the worker serves the other models. A hostile GGUF never
reaches MLX's reader; a load that kills the worker all the same (a native crash, a hang the supervisor ends) is
found by housekeeping from the model's record, still `loading` on a worker that holds no device. Such a death is
counted: a load that killed ONELANE_MAX_ATTEMPTS workers (2) in a row fails the model; after one, the next worker
loads it again (one death may be the machine's, and must not fail every job of the model)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tasks import keys
from tasks.catalogue import ModelConfig
from tasks.settings import Settings
from tests.gguf_files import header
from tests.helpers import JobsClient, wait_ended
from tests.test_recovery import wait_for_worker


def serve(settings: Settings, folder: Path, **models: dict[str, Any]) -> tuple[Settings, dict[str, str]]:
    """A models file of `models` (the first the default), as the web's settings and as a worker's environment."""
    lines = []
    for name, table in models.items():
        lines.append(f"[models.{name}]")
        lines += [f"{key} = {value!r}" if isinstance(value, str) else f"{key} = {str(value).lower()}" for key, value in table.items()]  # fmt: skip
    path = folder / "models.toml"
    path.write_text("\n".join(lines) + "\n")
    catalog = tuple(ModelConfig(name=name, **table) for name, table in models.items())
    served = settings.model_copy(update={"model": None, "models": catalog})
    return served, {"ONELANE_MODEL": "", "ONELANE_MODELS_FILE": str(path)}


def restarts(store) -> int:  # type: ignore[no-untyped-def]
    return int(store.redis.hget(keys.STATS, "worker_restarts") or 0)


def wait_restarts(store, n: int, timeout_s: float = 15) -> None:  # type: ignore[no-untyped-def]
    """Until the supervisor has restarted `n` workers: a frozen one is found dead (its lease lapsed) before it is
    killed, and counted once reaped."""
    deadline = time.monotonic() + timeout_s
    while restarts(store) < n:
        assert time.monotonic() < deadline, f"{restarts(store)} worker restarts, not {n}"
        time.sleep(0.05)  # a poll: nothing announces the supervisor's count
    assert restarts(store) == n


def test_a_model_whose_gguf_crashes_mlx_fails_its_own_jobs_and_the_other_model_serves(
    settings, store, make_app, worker_process, demo_model, tmp_path
):
    # Given a models file: "healthy" (the demo model, the default) and "bad", whose GGUF claims 2^62 tensors (MLX's
    # reader dies of it: SIGSEGV, so that every worker that loaded it died, and the supervisor restarted it hundreds
    # of times while the bad model's job stayed queued and held up the healthy model's)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(header(2**62, 0))
    served, env = serve(
        settings,
        tmp_path,
        healthy={"path": str(demo_model), "default": True},
        bad={"gguf": str(bad), "path": str(tmp_path / "bad")},
    )
    worker_process(**env)
    jobs = JobsClient(make_app(served).test_client())
    wait_for_worker(store)
    # When a job asks for the bad model, and then three for the healthy one
    asked = time.monotonic()
    doomed = jobs.submit("x", model="bad", max_tokens=4)["id"]
    healthy = [jobs.submit(f"h{n}", model="healthy", max_tokens=8, ignore_eos=True)["id"] for n in range(3)]
    # Then the bad model's job fails model_unavailable in seconds, in words naming what the file claims, and no path
    failed = wait_ended(store, doomed, timeout_s=60)
    took = time.monotonic() - asked
    assert (failed["status"], failed["error"]["type"]) == ("failed", "model_unavailable")
    message = failed["error"]["message"]
    assert "bad.gguf: its tensor count (4611686018427387904) exceeds what a file of 24 bytes" in message, message
    assert str(tmp_path) not in message
    assert took < 20, took
    # And the healthy model's jobs complete, no worker died, and nothing of the import is left
    assert [wait_ended(store, job_id, timeout_s=60)["status"] for job_id in healthy] == ["completed"] * 3
    assert restarts(store) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("bad")) == ["bad.gguf"]
    print(f"\nthe bad model's job failed {took:.2f} s after it was asked for; worker restarts: {restarts(store)}")


@pytest.fixture
def stuck_folder(demo_model: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A model folder whose weights are a FIFO nobody writes: mlx_lm.load blocks reading it, holding the GIL, so its
    worker freezes there as in a native hang, until killed. Yields (folder, an event set once a reader opened it)."""
    folder = tmp_path / "stuck"
    shutil.copytree(demo_model, folder)
    weights = folder / "model.safetensors"
    weights.unlink()
    os.mkfifo(weights)
    opened, writer = threading.Event(), []

    def wait_for_reader() -> None:
        writer.append(os.open(weights, os.O_WRONLY))  # returns once a reader has opened the FIFO
        opened.set()

    threading.Thread(target=wait_for_reader, daemon=True).start()
    yield folder, opened
    if not writer:  # (release the thread still waiting)
        os.close(os.open(weights, os.O_RDONLY | os.O_NONBLOCK))
    for fd in writer:
        os.close(fd)


def stuck_beside_healthy(settings, store, make_app, worker_process, demo_model, stuck_folder, name):  # type: ignore[no-untyped-def]
    """A worker serving "healthy" (the demo model, the default) and `name` (the stuck folder), stuck in loading
    `name` for a job of it. Returns (the web's settings, a client of it, the worker, that job's id)."""
    folder, opened = stuck_folder
    served, env = serve(
        settings, folder.parent, healthy={"path": str(demo_model), "default": True}, **{name: {"path": str(folder)}}
    )
    worker_process(**env)
    jobs = JobsClient(make_app(served).test_client())
    holder = wait_for_worker(store)
    job_id = jobs.submit("x", model=name, max_tokens=4, ignore_eos=True)["id"]
    assert opened.wait(60), f"the worker never read the {name} model's weights"
    return served, jobs, holder, job_id


def test_a_model_whose_load_kills_two_workers_fails_with_its_jobs_and_the_other_model_serves(
    settings, store, make_app, worker_process, demo_model, stuck_folder
):
    # Given a models file: "healthy" (the default) and "stuck", whose weights every load blocks on forever
    # When a job asks for the stuck model (the worker loads it, and is stuck there), then three for the healthy one
    served, jobs, holder, doomed = stuck_beside_healthy(
        settings, store, make_app, worker_process, demo_model, stuck_folder, "stuck"
    )
    healthy = [jobs.submit(f"h{n}", model="healthy", max_tokens=8, ignore_eos=True)["id"] for n in range(3)]
    assert store.redis.hget(keys.model("stuck"), "state") == "loading"
    # and the worker dies there (killed: as a native crash, or the supervisor ending a frozen worker, would); the
    # next worker loads it again, and freezes there too, until the supervisor ends it
    killed = time.monotonic()
    with contextlib.suppress(ProcessLookupError):  # (the supervisor may have ended it first: it froze)
        os.kill(holder.pid, signal.SIGKILL)
    # Then the stuck model fails after its second death, and its job with it, within seconds, saying so
    failed = wait_ended(store, doomed, timeout_s=60)
    took = time.monotonic() - killed
    assert (failed["status"], failed["error"]["type"]) == ("failed", "model_unavailable")
    assert failed["error"]["message"] == "the model failed to load: the worker died while loading it"
    assert failed["attempts"] == 0 and took < 20, (failed, took)
    record = store.redis.hgetall(keys.model("stuck"))
    assert record["state"] == "failed" and float(record["retry_at"]) - float(record["at"]) == pytest.approx(
        served.model_retry_s
    )
    refused = make_app(served).test_client().post("/v1/jobs", json={"prompt": "x", "model": "stuck"})
    assert refused.status_code == 503 and refused.get_json()["error"]["type"] == "model_unavailable"
    # And the healthy model's jobs complete on the next worker, which did not load the stuck model again
    assert [wait_ended(store, job_id, timeout_s=60)["status"] for job_id in healthy] == ["completed"] * 3
    wait_restarts(store, 2)
    assert int(store.redis.hget(keys.STATS, "model_load_failures")) == 1
    print(
        f"\nthe stuck model's job failed {took:.2f} s after its first worker died; worker restarts: {restarts(store)}"
    )


def test_a_model_whose_load_killed_one_worker_is_loaded_again_by_the_next_and_serves(
    settings, store, make_app, worker_process, demo_model, stuck_folder
):
    # Given a models file: "healthy" (the default) and "flaky", whose weights the first load blocks on, and a job
    # of it, its worker stuck in that load
    _, _, holder, job_id = stuck_beside_healthy(
        settings, store, make_app, worker_process, demo_model, stuck_folder, "flaky"
    )
    folder = stuck_folder[0]
    # When the worker dies there, once (the OOM killer, or a stall the supervisor ended: the machine's fault, not
    # the model's), and its weights are whole by the time the next worker reads them
    weights = folder / "model.safetensors"
    weights.unlink()  # (the FIFO: the frozen reader keeps it open)
    shutil.copy(demo_model / "model.safetensors", weights)
    with contextlib.suppress(ProcessLookupError):
        os.kill(holder.pid, signal.SIGKILL)
    # Then the next worker loads the model again, and its job completes, no attempt counted against it
    done = wait_ended(store, job_id, timeout_s=60)
    assert (done["status"], done["attempts"], done["usage"]["completion_tokens"]) == ("completed", 1, 4), done
    # And the model's record says loaded, its count of deaths cleared; nothing counted it a failed load
    record = store.redis.hgetall(keys.model("flaky"))
    assert (record["state"], record["deaths"]) == ("loaded", "0"), record
    assert restarts(store) == 1 and not store.redis.hget(keys.STATS, "model_load_failures")


def test_a_default_model_whose_load_froze_the_worker_is_not_loaded_again_and_the_other_model_serves(
    settings, store, make_app, worker_process, demo_model, stuck_folder, tmp_path
):
    # Given a models file whose default model, "stuck", freezes the worker that loads it, beside "healthy"; a job of
    # each waits before any worker runs
    folder, opened = stuck_folder
    served, env = serve(
        settings, folder.parent, stuck={"path": str(folder), "default": True}, healthy={"path": str(demo_model)}
    )
    jobs = JobsClient(make_app(served).test_client())
    doomed = jobs.submit("x", model="stuck", max_tokens=4)["id"]
    healthy = jobs.submit("h", model="healthy", max_tokens=8, ignore_eos=True)["id"]
    # When the worker starts, loading its default model first, and freezes there (its lease lapses: the standby
    # takes the device, and the supervisor kills the frozen one); the standby loads it again and freezes likewise
    worker_process(**env)
    assert opened.wait(60), "the worker never read the stuck model's weights"
    frozen = time.monotonic()
    # Then the worker after those two does not load the stuck model again: it failed, its job with it; the healthy
    # one runs
    failed = wait_ended(store, doomed, timeout_s=60)
    took = time.monotonic() - frozen
    assert (failed["status"], failed["error"]["message"]) == (
        "failed",
        "the model failed to load: the worker died while loading it",
    )
    assert wait_ended(store, healthy, timeout_s=60)["status"] == "completed"
    assert restarts(store) <= 2 and took < 20, (restarts(store), took)
    # and each frozen worker, found hung by its keeper, wrote where it was: its threads' stacks, the load in them
    log = (tmp_path / "worker-0.log").read_text()
    assert log.count("Current thread") >= 2 and "in load_model" in log, log
    print(f"\nthe stuck model's job failed {took:.2f} s after its worker froze; worker restarts: {restarts(store)}")
