"""A worker whose heartbeat comes late (a starved host; here, SIGSTOP past its lease) is not a worker that died: its
jobs go on elsewhere from their tokens at once, and its supervisor kills it as soon as another worker holds the
device (two processes never work on one GPU), which is not counted as a death: a lapsed run is counted only at the
job's next hand-back, so one late heartbeat costs a job one resumption and no attempt, and a job fails
worker_crashed only when its workers die or hang again and again. A death counts once the supervisor reaps the
process, even after its lease lapsed. A worker merely starved (runnable, but given next to no CPU) keeps its lease."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks import keys
from tasks.catalogue import SHIPPED_DEMO_MODEL
from tests.helpers import JobsClient, wait_ended, wait_event
from tests.test_recovery import wait_for_worker

GREEDY = {"prompt": "The queue", "max_tokens": 600, "ignore_eos": True, "temperature": 0}


@pytest.fixture
def supervisor(worker_process):  # type: ignore[no-untyped-def]
    """`onelane worker`: a supervisor and its two worker processes (lease 2 s), serving the shipped demo model, which
    writes words (a token event a write)."""
    return worker_process(ONELANE_MODEL=str(SHIPPED_DEMO_MODEL))


@pytest.fixture
def jobs(settings, make_app, supervisor):  # type: ignore[no-untyped-def]
    """A client of the web, which serves the same model."""
    return JobsClient(make_app(settings.model_copy(update={"model": str(SHIPPED_DEMO_MODEL)})).test_client())


def runs(store, job_id: str) -> int:  # type: ignore[no-untyped-def]
    """How many runs the job has started."""
    return [e.type for e in store.events(job_id)].count("started")


def requeued(store, job_id: str) -> list[int]:  # type: ignore[no-untyped-def]
    """The attempt each hand-back of the job left it at (a run not counted: the same as before it)."""
    return [e.attempt for e in store.events(job_id) if e.type == "requeued"]


def wait_gone(pid: int, timeout_s: float = 60) -> None:
    """Until the process `pid` (another's child: the supervisor's) has ended."""
    with contextlib.suppress(ProcessLookupError):
        fd = os.pidfd_open(pid)
        try:
            assert select.select([fd], [], [], timeout_s)[0], f"process {pid} still runs"
        finally:
            os.close(fd)


def wait_exit_logged(log: Path, pid: int, timeout_s: float = 30) -> str:
    """How the supervisor saw the worker process `pid` end ('3': it stopped itself; '-9': it was killed)."""
    line = f"worker process {pid} exited ("
    deadline = time.monotonic() + timeout_s
    while line not in (text := log.read_text()):
        assert time.monotonic() < deadline, f"the supervisor never reaped {pid}"
        time.sleep(0.05)  # a poll: the supervisor announces a reap in its log only
    return text.split(line, 1)[1].split(")", 1)[0]


def freeze_until_handed_back(store, job_id: str, n: int) -> int:  # type: ignore[no-untyped-def]
    """Freeze the worker running the job's n-th run past its lease, until the job is handed back and the worker is
    gone."""
    wait_event(store, job_id, lambda e: e.type == "token" and runs(store, job_id) == n, 90)
    frozen = wait_for_worker(store).pid
    os.kill(frozen, signal.SIGSTOP)
    wait_event(store, job_id, lambda e: e.type == "requeued" and len(requeued(store, job_id)) == n, 60)
    wait_for_worker(store, other_than=frozen)
    wait_gone(frozen)  # (still stopped: its supervisor kills it once another holds the device, never lets it go on)
    return frozen


CGROUPS = Path("/sys/fs/cgroup")


def cpu_cgroup() -> tuple[Path, str]:
    """Where a process's CPU weight is set on this machine: cgroup v1's cpu hierarchy, or cgroup v2's root with the cpu
    controller; and the file that sets it ('cpu.shares', least 2, or 'cpu.weight', least 1)."""
    if (CGROUPS / "cpu" / "cpu.shares").exists():
        return CGROUPS / "cpu", "cpu.shares"
    controllers = CGROUPS / "cgroup.controllers"
    assert controllers.exists() and "cpu" in controllers.read_text().split(), "no cgroup here sets a CPU weight"
    (CGROUPS / "cgroup.subtree_control").write_text("+cpu")
    return CGROUPS, "cpu.weight"


def own_cgroup(pid: int, v1: bool) -> str:
    """The cgroup the process `pid` is in, in the hierarchy that sets CPU weights (/proc/PID/cgroup)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if ("cpu" in controllers.split(",")) if v1 else controllers == "":
            return path
    raise AssertionError(f"process {pid} is in no cgroup that sets a CPU weight")


@contextlib.contextmanager
def starved(pid: int) -> Iterator[None]:
    """The process `pid` on CPU 0 only, at the least CPU weight there is (a cgroup of its own), beside a busy process
    there: its threads stay runnable and get next to no CPU, as on a machine far busier than it can bear. (Its keeper,
    another process, is not starved.)"""
    root, weight = cpu_cgroup()
    home = root / own_cgroup(pid, v1=weight == "cpu.shares").lstrip("/")
    group = root / f"onelane-starved-{pid}"
    group.mkdir()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(busy.pid, {0})
        (group / weight).write_text("2" if weight == "cpu.shares" else "1")
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(tid), {0})
        (group / "cgroup.procs").write_text(str(pid))
        yield
    finally:
        busy.kill()
        busy.wait()
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                os.sched_setaffinity(int(tid), os.sched_getaffinity(0))
        deadline = time.monotonic() + 30
        while True:  # (its processes back where they were; one that ended leaves once it is reaped)
            for left in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (home / "cgroup.procs").write_text(left)
            try:
                group.rmdir()
                break
            except OSError:
                assert time.monotonic() < deadline, f"{group} would not go"
                time.sleep(0.05)  # a poll: nothing announces a reap


def cpu_s(pid: int) -> float:
    """The CPU time the process `pid` has used, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_worker_starved_for_four_leases_under_a_job_keeps_its_lease_and_its_job(jobs, store):
    # Given a supervised worker (lease 2 s) generating a job
    job_id = jobs.submit(**GREEDY)["id"]
    wait_event(store, job_id, lambda e: e.type == "token")
    active = wait_for_worker(store)
    # When the machine gives it next to no CPU for four leases: its heartbeat cannot run, and none of its threads
    # computes; they wait for a CPU
    with starved(active.pid):
        before = cpu_s(active.pid)
        time.sleep(8)  # (what is shown is that nothing happens meanwhile: no event to await)
        used = cpu_s(active.pid) - before
    # Then its keeper kept its lease: the same worker holds the device, and the job ends in its one run
    assert used < 0.4, f"the worker was not starved: it used {used:.2f} s of CPU in 8 s"
    assert wait_for_worker(store).worker == active.worker
    done = wait_ended(store, job_id, timeout_s=120)
    assert (done["status"], done["attempts"], runs(store, job_id)) == ("completed", 1, 1), done
    assert requeued(store, job_id) == []


def test_a_worker_frozen_past_its_lease_twice_under_a_job_costs_it_resumptions_not_its_answer(jobs, store, tmp_path):
    # Given a supervised worker (lease 2 s) and the answer a greedy job gets from it uninterrupted
    whole = wait_ended(store, jobs.submit(**GREEDY)["id"], timeout_s=120)["output"]

    # When the same job runs again, and the worker running it freezes past its lease, twice in a row
    job_id = jobs.submit(**GREEDY)["id"]
    store.follow_live(store.get(job_id))  # its tokens written as they come, as a stream opened on it would
    for n in (1, 2):
        frozen = freeze_until_handed_back(store, job_id, n)
        # Then each frozen worker was killed once another held the device (never two processes on it)
        assert wait_exit_logged(tmp_path / "worker-0.log", frozen) == "-9"

    # And the job completes, its stream whole: nothing repeated or lost
    done = wait_ended(store, job_id, timeout_s=120)
    # (the first lapse is counted when the second shows its worker never woke: a third in a row would fail it)
    assert (done["status"], done["attempts"], done["usage"]["completion_tokens"]) == ("completed", 2, 600), done
    assert requeued(store, job_id) == [0, 1]
    log = store.events(job_id)
    assert "".join(e.text for e in log if e.type == "token") == done["output"]
    # And each run went on from the tokens before it: the greedy answer, for 1,000 characters past the last hand-back
    # at least (farther on a near-tie may fall the other way: see tests/test_resume.py)
    last = max(i for i, e in enumerate(log) if e.type == "requeued")
    part = len("".join(e.text for e in log[:last] if e.type == "token")) + 1000
    assert done["output"][:part] == whole[:part]
    # And no frozen worker wrote after it lost the job: no token between a hand-back and the next run's start
    types = [e.type for e in log]
    for at in (i for i, t in enumerate(types) if t == "requeued"):
        assert types[at + 1] == "started", types[at : at + 4]


def test_an_idle_worker_frozen_past_its_lease_is_replaced_and_counts_against_nothing(jobs, store, tmp_path):
    # Given a supervised worker, idle
    frozen = wait_for_worker(store).pid
    # When it freezes past its lease
    os.kill(frozen, signal.SIGSTOP)
    wait_for_worker(store, other_than=frozen)
    wait_gone(frozen)
    # Then it was killed once its standby held the device, and nothing was counted: a job runs once, the model is
    # not a failed load
    assert wait_exit_logged(tmp_path / "worker-0.log", frozen) == "-9"
    done = wait_ended(store, jobs.submit("after", max_tokens=4, ignore_eos=True)["id"], timeout_s=60)
    assert (done["status"], done["attempts"]) == ("completed", 1)
    record = store.redis.hgetall(keys.model(str(SHIPPED_DEMO_MODEL)))
    assert record.get("state") == "loaded" and record.get("deaths", "0") == "0", record
    stats = store.redis.hgetall(keys.STATS)
    assert "requeued" not in stats and "model_load_failures" not in stats, stats


def test_a_job_under_which_every_worker_hangs_for_good_still_fails_worker_crashed(jobs, store):
    # Given a supervised worker, and a job
    job_id = jobs.submit("hang", max_tokens=6000, ignore_eos=True)["id"]
    store.follow_live(store.get(job_id))
    # When every worker that runs it freezes for good (a native hang that holds the interpreter): none ever wakes,
    # and the supervisor kills each once it has had time to
    for n in (1, 2, 3):
        wait_event(store, job_id, lambda e: e.type == "token" and runs(store, job_id) == n, 90)
        os.kill(wait_for_worker(store).pid, signal.SIGSTOP)
    # Then each lapse is counted once the next shows that its worker never woke: after ONELANE_MAX_ATTEMPTS of them
    # the job fails worker_crashed at its third hang, rather than run for ever
    failed = wait_ended(store, job_id, timeout_s=90)
    assert (failed["status"], failed["error"]["type"], failed["attempts"]) == ("failed", "worker_crashed", 2), failed
    assert requeued(store, job_id) == [0, 1]


def test_a_worker_that_dies_while_its_supervisor_is_starved_counts_once_it_is_reaped(jobs, store, supervisor):
    # Given a job running on a supervised worker
    job_id = jobs.submit(**GREEDY)["id"]
    store.follow_live(store.get(job_id))
    wait_event(store, job_id, lambda e: e.type == "token")
    # When the worker dies while its supervisor cannot run (stopped here; starved, on a loaded host): its lease
    # lapses before anybody saw it die, and the job goes back as a late heartbeat's would, not counted yet
    os.kill(supervisor.pid, signal.SIGSTOP)
    try:
        os.kill(wait_for_worker(store).pid, signal.SIGKILL)
        wait_event(store, job_id, lambda e: e.type == "requeued")
    finally:
        os.kill(supervisor.pid, signal.SIGCONT)
    # Then once the supervisor reaps it, its run counts: the job completes with both its runs counted
    done = wait_ended(store, job_id, timeout_s=120)
    assert (done["status"], done["attempts"], done["usage"]["completion_tokens"]) == ("completed", 2, 600), done
    # and the dead worker's requeue counted nothing when it came (attempt 0). On a loaded machine the next worker's
    # heartbeat can come late as well (2 s leases, beside two busy processes: seen): a requeue more, which counts
    # nothing either (the job's attempts are 2 all the same)
    again = requeued(store, job_id)
    assert again[0] == 0 and again == sorted(again) and max(again) <= 1, again
