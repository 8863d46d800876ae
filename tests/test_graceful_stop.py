"""A worker stopped in good order (a deploy, a restart, Ctrl-C) never fails a user's job: its batch drains while its
lease holds, what still runs goes back to the front of the queue without costing an attempt, and the next worker
runs it to the end. The worker process and then the service are stopped under one job, Ctrl-C on `onelane up`
under another, with the web's housekeeping looking on.

The lease (2 s) is shorter than the drain (2.5 s): a worker whose lease stopped being renewed while draining would be
taken for dead, its job requeued as a crash (`attempt: 1`), and the second stop would fail it. (Not a shorter lease:
this shared machine has stalled every process for over 2 s; the lease keeper, a process of its own, renews it through
such stalls, as it does in every kill story's 2 s lease.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from tasks.events import Event
from tasks.settings import Settings
from tasks.store import Store
from tests.conftest import free_port, with_shim
from tests.helpers import EventStream, wait_answering, wait_ended, wait_event
from tests.test_recovery import wait_for_worker

# Each story starts the worker (or the whole stack) three times and waits on each: on a CI machine running other
# work beside it, that took over the suite's 120 s, and a third run's ~1,000 tokens over 90 s (the small model made
# ~20 tokens/s there, against ~45 alone on this 2-core machine). Every wait inside is bounded on its own, and fails
# first if something hangs.
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow_file]

DRAIN = {"ONELANE_DRAIN_S": "2.5", "ONELANE_LEASE_S": "2"}
# Long enough to outlast two drains. The stories run a bigger random model than the demo one ("small": 8 layers of
# 512), which alone on the worker makes about 45 tokens/s here (its load times a step at ~23 ms), so a run stopped at
# its first token keeps ~120 tokens (estimated: 196 and 188 were measured quiet with a 4 s drain, not yet with this one);
# two such runs must leave work for a third, with room for a machine twice as fast (~500 for the two) and for a story
# that sees the first token late. Not more: every token the two stops leave is one the third run makes while the
# story waits (1,200 tokens and 4 s drains made this file 111 s of the suite's time on 2026-12-06).
# Sampled: greedy, a random model can fall into tokens that are pieces of one UTF-8 character, which write no text
# (and so no event) until the job ends, and a story would wait for a token of its run that never shows.
LONG = {"max_tokens": 800, "ignore_eos": True, "temperature": 1.0, "seed": 7}
ONCE = {**LONG, "max_tokens": 400}  # a job stopped once: one drain's ~120 tokens, room for a machine twice as fast


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from worker.demo_build.model import make_demo_model

    return make_demo_model(tmp_path_factory.mktemp("models") / "small", size="small")


@pytest.fixture
def settings(settings: Settings, slow_model: Path) -> Settings:
    """Every story here serves the slow model: the web that admits the jobs, and the workers that run them."""
    return settings.model_copy(update={"model": str(slow_model)})


def runs(store: Store, job_id: str) -> int:
    return [e.type for e in store.events(job_id)].count("started")


def wait_generating(store: Store, job_id: str, run: int) -> None:
    """Until the job's `run`-th run has made a token: its events followed one by one, each once (those already in the
    log may come again live), not the whole log read again for each."""
    seen = {"index": -1, "runs": 0}

    def generating(event: Event) -> bool:
        if event.index <= seen["index"]:
            return False
        seen["index"] = event.index
        seen["runs"] += event.type == "started"
        return seen["runs"] == run and event.type == "token"

    wait_event(store, job_id, generating, timeout_s=60)


def assert_handed_back(store: Store, job_id: str, times: int) -> None:
    job = store.get(job_id)
    assert (job.status.value, job.attempts, job.position) == ("queued", 0, 1)
    assert [e.attempt for e in store.events(job_id) if e.type == "requeued"] == [0] * times


def story(store: Store, job_id: str, logs: list[Path]) -> str:
    """What a failure needs told: the job's events but its tokens, and what the processes logged of it and of the
    device (the CI log is all there is to read afterwards)."""
    events = [(e.type.value, e.attempt, e.completion_tokens) for e in store.events(job_id) if e.type != "token"]
    wanted = (job_id, "device", "lease", "exited", "killing", "heartbeat", "stalled", "Traceback", "Error")
    text = "".join(log.read_text(errors="replace") for log in logs)
    lines = [line[:300] for line in text.splitlines() if any(w in line for w in wanted)]
    return f"events: {events}\nlog:\n" + "\n".join(lines[-60:])


def assert_completed_once(store: Store, job_id: str, stops: int, logs: list[Path], tokens: object) -> None:
    done = wait_ended(store, job_id, timeout_s=240)  # (up to 800 tokens on a machine as loaded as above)
    usage = done["usage"]["completion_tokens"]
    outcome = (done["status"], done["attempts"], usage)
    assert outcome == ("completed", 1, tokens), f"{outcome} {done.get('error')}\n{story(store, job_id, logs)}"
    assert runs(store, job_id) == stops + 1
    assert [e.attempt for e in store.events(job_id) if e.type == "requeued"] == [0] * stops


def test_a_job_stopped_by_its_worker_process_then_by_the_service_never_costs_an_attempt(
    jobs, store, worker_process, tmp_path
):
    """SIGTERM to the worker process holding the device: it drains and exits; its supervisor neither kills it as
    frozen nor counts a crash; the standby takes over at once. Then SIGTERM to `onelane worker` (the supervisor), as
    `docker compose stop` sends it: the job is handed back again. Neither stop costs the job an attempt."""
    service = worker_process(**DRAIN)
    job = jobs.submit("restart", **LONG)
    wait_generating(store, job["id"], 1)
    active = wait_for_worker(store)
    os.kill(active.pid, signal.SIGTERM)

    wait_generating(store, job["id"], 2)
    assert wait_for_worker(store).pid != active.pid
    service.send_signal(signal.SIGTERM)
    assert service.wait(timeout=60) == 0
    assert_handed_back(store, job["id"], 2)
    log = (tmp_path / "worker-0.log").read_text()
    # (every kill of the supervisor's says "killing"; "frozen" may be a stack's `<frozen runpy>`, if the worker's
    # keeper found it hung on this shared machine and it wrote its threads' stacks)
    assert "killing" not in log, log
    assert log.count("exited (0)") == 1, log

    worker_process(**DRAIN)
    assert_completed_once(
        store, job["id"], stops=2, logs=sorted(tmp_path.glob("worker-*.log")), tokens=LONG["max_tokens"]
    )


def up_env(settings: Settings, var: Path, port: int) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # `up` runs its own Redis
    return {
        **environ,
        "ONELANE_VAR_DIR": str(with_shim(var)),
        "ONELANE_MODEL": settings.model_path,
        "ONELANE_PORT": str(port),
        "ONELANE_MAX_TOKENS_LIMIT": str(LONG["max_tokens"]),
        **DRAIN,
    }


def start_up(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`onelane up` as a terminal starts it: the leader of its own foreground process group."""
    out = open(log, "ab")
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", "up"], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )


def follow(stream: EventStream) -> None:
    """Someone reads the job's events until the web goes away."""

    def read() -> None:
        with contextlib.suppress(requests.RequestException):
            for _ in stream:
                pass

    threading.Thread(target=read, daemon=True).start()


def ctrl_c(up: subprocess.Popen[bytes], log: Path) -> None:
    """The terminal's Ctrl-C: SIGINT to the whole foreground group; `up` stops everything and exits 0, quietly."""
    os.killpg(up.pid, signal.SIGINT)
    try:
        assert up.wait(timeout=90) == 0, log.read_text()
        assert "Traceback" not in log.read_text(), log.read_text()
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()


def test_ctrl_c_on_onelane_up_while_someone_follows_hands_the_job_back(settings, tmp_path):
    """Ctrl-C reaches every process of the terminal's group at once: Redis must outlive the draining worker, and a
    follower's open stream must not keep the web's housekeeping around to take the batch for a crash's."""
    from tasks.embedded_redis import EmbeddedRedis

    port, var = free_port(), tmp_path / "var"
    base, env, log = f"http://127.0.0.1:{port}", up_env(settings, var, port), tmp_path / "up.log"
    store = Store.connect(settings.model_copy(update={"redis_url": EmbeddedRedis(var / "redis").url}))
    try:
        up = start_up(env, log)
        try:
            wait_answering(f"{base}/readyz", up, timeout_s=90)
            response = requests.post(f"{base}/v1/jobs", json={"prompt": "ctrl-c", **ONCE}, timeout=10)
            assert response.status_code == 202, response.text
            job_id = response.json()["id"]
            wait_generating(store, job_id, 1)
            follow(EventStream(base, job_id))
        finally:
            ctrl_c(up, log)
        # Redis stopped last, with the job back in it (AOF): read it as the next start will
        redis_server = EmbeddedRedis(var / "redis").start()
        try:
            store.redis.connection_pool.reset()
            assert_handed_back(store, job_id, 1)
        finally:
            redis_server.stop()
        up = start_up(env, log)
        try:
            wait_answering(f"{base}/readyz", up, timeout_s=90)
            store.redis.connection_pool.reset()
            assert_completed_once(store, job_id, stops=1, logs=[log], tokens=ONCE["max_tokens"])
        finally:
            ctrl_c(up, log)
    finally:
        store.redis.close()
        subprocess.run(["pkill", "-f", str(var / "redis")], check=False)  # whatever failed, no Redis left behind


def test_a_worker_whose_supervisor_died_stops_rather_than_hold_the_device(store, worker_process):
    service = worker_process(**DRAIN)
    wait_for_worker(store)
    service.send_signal(signal.SIGKILL)  # the supervisor alone (the OOM killer, say): its workers are orphaned
    service.wait()

    deadline = time.monotonic() + 30
    while members := group(service.pid):  # the active worker and the standby
        assert time.monotonic() < deadline, f"orphaned workers still running: {members}"
        time.sleep(0.1)  # a poll: nothing announces another process's exit
    assert store.readings.snapshot().workers == []  # and the last one freed the device


def group(pgid: int) -> list[int]:
    """The live processes of a process group (zombies left out)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def test_ctrl_c_while_a_worker_process_still_imports_ends_it_quietly(settings, tmp_path):
    """The standby a supervisor has just started may take seconds over its imports on a busy machine; the terminal's
    Ctrl-C lands in the middle of them. It holds nothing yet: it exits at once, with 0, and prints no traceback."""
    env = {
        **{k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},
        "REDIS_URL": settings.effective_redis_url,
        "ONELANE_MODEL": settings.model_path,
        "ONELANE_VAR_DIR": str(tmp_path),
    }
    for command in (["worker.main"], ["cli.main", "worker", "--no-supervise"]):
        process = subprocess.Popen(
            [sys.executable, "-m", *command], env=env, stderr=subprocess.PIPE, start_new_session=True
        )
        try:
            maps = Path(f"/proc/{process.pid}/maps")
            deadline = time.monotonic() + 60
            while "libmlx" not in maps.read_text():  # MLX is loading: mlx-lm and transformers are still to come
                assert process.poll() is None and time.monotonic() < deadline, "the worker never loaded MLX"
                time.sleep(0.005)  # a poll: nothing announces another process's imports
            os.killpg(process.pid, signal.SIGINT)
            _, err = process.communicate(timeout=30)
            assert process.returncode == 0 and b"Traceback" not in err, err.decode()
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def test_ctrl_c_as_a_service_interpreter_starts_ends_it_quietly(settings, tmp_path):
    """`onelane up` starts the web and the worker, the supervisor its workers, in the terminal's group: a Ctrl-C can
    land before any of their code runs, while Python itself starts. It waits for their quiet handler, then ends
    them with 0 and no traceback (it killed them by the signal, or printed "Fatal Python error" and a traceback)."""
    from cli.serve import _onelane
    from tasks.quiet_start import start_service
    from worker.supervisor import Supervisor

    env = {**os.environ, "REDIS_URL": settings.effective_redis_url, "ONELANE_VAR_DIR": str(tmp_path)}
    supervised = Supervisor(settings, env=env)
    commands = [_onelane("web", "--port", str(free_port())), _onelane("worker"), supervised.command]
    for command in commands:
        # Given a service just started as its parent starts it (its exec done, its interpreter not yet running)
        process = start_service(command, env=supervised.env, stderr=subprocess.PIPE, start_new_session=True)
        try:
            # When the terminal's Ctrl-C reaches it at once
            os.kill(process.pid, signal.SIGINT)
            # Then it exits by itself, with 0, quietly
            _, err = process.communicate(timeout=60)
            assert process.returncode == 0 and not err, (command, process.returncode, err.decode())
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    # And its parent still takes a Ctrl-C of its own
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def test_a_stop_that_never_ends_ends_the_process_after_its_time():
    """An orphaned worker whose stop hangs (a step stuck on the device holds the models' lock, or Redis went away in
    the middle of a hand-back) must not live on for nobody: past its time, the process exits."""
    from worker.main import EXIT_STUCK, stop_within

    # Given a worker whose stop never returns, and one whose stop ends
    class Worker:
        def __init__(self, ends: bool) -> None:
            self.ends = ends
            self.stopping, self.stuck = threading.Event(), threading.Event()

        def stop(self, release: bool) -> None:
            self.stopping.set()  # (its watch has started)
            if not self.ends:
                self.stuck.wait()

    exits: list[int] = []
    stuck, orderly = Worker(ends=False), Worker(ends=True)

    # When each stops with 0.2 s to do it
    threading.Thread(target=stop_within, args=(stuck, 0.2, True, exits.append), daemon=True).start()
    assert stuck.stopping.wait(30)
    stop_within(orderly, 0.2, True, lambda code: exits.append(-code))

    # Then the stuck one's process exits, saying it was stuck; the orderly one's is left to end by itself
    for watch in [thread for thread in threading.enumerate() if thread.name == "stop-watch"]:
        watch.join(timeout=30)
    stuck.stuck.set()  # (its thread ends: nothing of the story outlives it)
    assert exits == [EXIT_STUCK]
