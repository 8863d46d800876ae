"""A worker's device lease is kept by its keeper (worker/keeper.py), a process apart from the worker's interpreter:
a worker whose interpreter is held (a native call, a starved machine) keeps its lease and its jobs; one that is
stopped loses the lease within it; one whose interpreter stays held past ONELANE_LEASE_HUNG_S loses it then."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import pytest

from tasks import keys
from tasks.store import Store
from tests.helpers import wait_ended, wait_event
from tests.test_recovery import wait_for_worker
from tests.test_worker import compute_holding_the_interpreter, hold_the_interpreter, lease_renewed
from worker.main import GpuWorker


def holder(store: Store) -> str | None:
    worker: str | None = store.redis.hget(keys.device(store.settings.device), "worker")
    return worker


def test_a_worker_whose_interpreter_is_held_for_four_leases_keeps_its_lease_and_its_job(jobs, store, start_worker):
    # Given a worker (lease 1.5 s) generating a long job
    worker = start_worker(lease_s=1.5)
    job = jobs.submit("long", max_tokens=400, ignore_eos=True)
    wait_event(store, job["id"], lambda e: e.type == "token")
    lease_renewed(store)

    # When a computation holds its interpreter for 6 s: its heartbeat thread cannot run, its CPU time grows
    compute_holding_the_interpreter(6)

    # Then the lease is still its own (the keeper renewed it), and the job ends in its one run
    assert holder(store) == worker.id
    lease_renewed(store)  # (the heartbeat's renewal is taken: the fixture fails a worker told it lapsed)
    done = wait_ended(store, job["id"], 120)
    assert done["status"] == "completed"
    assert [e.type for e in store.events(job["id"])].count("started") == 1


@pytest.mark.parametrize("hold", ["computing", "blocked"])
def test_a_worker_whose_interpreter_stays_held_past_the_hung_bound_loses_its_lease_and_says_where(
    hold, settings, engine, store, capfd
):
    # Given a worker whose lease is 1 s, taken as hung after 3 s without its heartbeat (at once if it uses no CPU)
    told: list[str] = []
    worker = GpuWorker(settings.model_copy(update={"lease_s": 1.0, "lease_hung_s": 3.0}), engine, told.append, 50)
    assert worker.start()
    try:
        lease_renewed(store)

        # When its interpreter is held for 6 s (past 3 s + the lease), computing or blocked (a native call that
        # waits for ever: a read, a deadlock)
        holding = compute_holding_the_interpreter if hold == "computing" else hold_the_interpreter
        holding(6)

        # Then the lease lapsed meanwhile: nobody holds it, and the worker is told so as its heartbeat runs again
        assert holder(store) is None
        deadline = time.monotonic() + 10
        while not told:
            assert time.monotonic() < deadline, "the worker was never told its lease lapsed"
            time.sleep(0.05)  # a poll: the heartbeat's next round tells
        assert "the lease lapsed" in told[0]
        # and its keeper had it write every thread's stack as it found it hung: the holding call in it
        stacks = capfd.readouterr().err
        assert "most recent call first" in stacks and f"in {holding.__name__}" in stacks, stacks
        assert "worker/heartbeat.py" in stacks  # (the heartbeat, waiting for the interpreter)
    finally:
        worker.stop()


def stop_the_holder(store: Store) -> Any:
    """SIGSTOP the worker holding the device at the stop, and return it: on a starved machine the first may lose its
    lease as it loads (its standby then takes the device), before or as it is stopped."""
    deadline = time.monotonic() + 60
    while True:
        active = wait_for_worker(store)
        with contextlib.suppress(ProcessLookupError):  # (it ended after losing its lease: the next holds it)
            os.kill(active.pid, signal.SIGSTOP)
            if holder(store) == active.worker:
                return active
            os.kill(active.pid, signal.SIGCONT)
        assert time.monotonic() < deadline, "no worker held the device as it was stopped"


def test_a_stopped_worker_loses_its_lease_within_it(store, worker_process):
    # Given `onelane worker` (lease 2 s) holding the device, its keeper renewing
    worker_process()
    wait_for_worker(store)
    lease_renewed(store)

    # When the worker holding it is stopped (SIGSTOP)
    active = stop_the_holder(store)
    stopped = time.monotonic()
    try:
        # Then its lease is gone within the lease (2 s), and a margin for a loaded machine's polls
        while holder(store) == active.worker:
            time.sleep(0.01)  # a poll: a lapse is announced nowhere
        lost_after = time.monotonic() - stopped
    finally:
        os.kill(active.pid, signal.SIGCONT)
    print(f"the stopped worker lost its lease {lost_after:.2f} s after SIGSTOP")  # (bench figures: pytest -s)
    assert lost_after < 2 + 1.0, f"the stopped worker kept its lease {lost_after:.1f} s"


def test_a_keeper_is_raised_by_its_worker_as_soon_as_it_starts():
    import subprocess

    from worker.keeper_link import PRIORITY_BOOST, boost

    # Given a process the worker has just started, as it starts its keeper (one that does nothing itself: on a
    # starved machine the keeper's own start took seconds, before it could raise itself)
    child = subprocess.Popen(["sleep", "30"])
    try:
        # When the worker raises it
        boost(child.pid)
        # Then it runs at the worker's priority and PRIORITY_BOOST more (where the system allows it: as root)
        own = os.getpriority(os.PRIO_PROCESS, 0)
        expected = own - PRIORITY_BOOST if os.geteuid() == 0 else own
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == expected
    finally:
        child.kill()
        child.wait()


def test_a_standbys_keeper_waits_ready_and_keeps_the_lease_from_the_moment_the_device_is_taken(settings, store):
    from worker.keeper_link import KeeperLink

    # Given a standby's keeper (lease 1 s), started while another worker holds the device
    device = keys.device(settings.device)
    store.redis.hset(device, "worker", "other")
    keeper = KeeperLink(settings.model_copy(update={"lease_s": 1.0}), "standby")
    keeper.start()
    try:
        # (in a process group of its own: a terminal's Ctrl-C to the worker's group must not end it mid-start)
        assert os.getpgid(keeper.process.pid) != os.getpgrp()

        # When it is ready: its start is paid now, while the standby waits; and it waits as long as the standby
        # does, ending on nobody's lease (watched for a lease: nothing to await, it must do nothing)
        assert keeper.ready() is None, "the keeper never said it could renew"
        time.sleep(1.0)
        assert keeper.process is not None and keeper.process.poll() is None, "the standby's keeper ended"
        assert holder(store) == "other"

        # And the standby then takes the device (a lease far longer than its own, so a renewal shows)
        store.redis.hset(device, "worker", "standby")
        store.redis.pexpire(device, 600_000)
        keeper.hold()

        # Then its keeper renews it at once, with nothing from the worker's heartbeat: the lease is its 1 s
        deadline = time.monotonic() + 30
        while not 0 < store.redis.pttl(device) <= 1000:
            assert time.monotonic() < deadline, "the keeper never renewed the lease it was told to hold"
            time.sleep(0.01)  # a poll: a renewal is announced nowhere
        assert keeper.process.poll() is None
    finally:
        keeper.stop()
        store.redis.delete(device)
