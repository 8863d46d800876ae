"""A load left unfinished is blamed on the model only when its worker died or hung there (tasks/lua/failed_models.lua):
a worker whose lease lapsed while it loaded, on a machine that starved it, wakes and stops, and costs the model
nothing, however often it happens; one that never wakes is counted at the model's next unfinished load; one its
keeper found hung is counted at once; a late worker that finishes its load writes nothing. Stories on the store's
verbs, as the worker, its keeper and housekeeping run them."""

from __future__ import annotations

import os

import pytest

from tasks import keys
from tasks.store import Store
from tasks.store.worker import WorkerStore

MODEL = "m"


def loading(store: Store, worker: str) -> WorkerStore:
    """`worker` takes the device and begins loading MODEL."""
    it = store.for_worker(worker)
    assert it.take_device() == "ok"
    it.model_loading(MODEL)
    return it


def lapse(store: Store) -> None:
    """The device's lease runs out (as its time to live does, under a worker that renews it no more)."""
    store.redis.delete(keys.device(store.settings.device))


def check(store: Store) -> list[tuple[str, int]]:
    return [(c.verdict, c.n) for c in store.upkeep.check_models([MODEL])]


@pytest.fixture
def store(store: Store) -> Store:
    """A store that counts two deaths in a row of a load as the model's failure (as the test workers do)."""
    return Store(store.redis, store.settings.model_copy(update={"max_attempts": 2}))


def test_workers_late_in_a_models_load_again_and_again_cost_it_nothing(store):
    # Given a worker loading the model
    late = loading(store, "a")
    for after in "bcd":
        # When its lease lapses there (the machine starved it), the next worker's check finds the load unfinished
        lapse(store)
        assert check(store) == [("lapsed", 0)]
        # and the late worker wakes and is told so: it exits ("lost device"), and its supervisor reaps it
        assert late.renew_device() == "lapsed"
        assert store.upkeep.drop_device(os.getpid(), died=True) is False  # (nobody holds the device now)
        assert store.redis.hget(keys.WORKER_PREFIX + late.worker, "dead")
        # Then the next worker loads the model again, and so on: no lapse of a worker that woke is counted
        late = loading(store, after)
    late.model_loaded(MODEL, 1.0, 1)
    record = store.redis.hgetall(keys.model(MODEL))
    assert (record["state"], record["deaths"], record["lapsed"]) == ("loaded", "0", "")


def test_a_worker_that_never_wakes_from_a_models_load_is_counted_at_the_next_one(store):
    # Given a worker whose lease lapsed while it loaded the model, and who never woke (its supervisor killed it)
    loading(store, "a")
    lapse(store)
    assert check(store) == [("lapsed", 0)]
    # When the next worker's lease lapses in the same load, and it does not wake either
    loading(store, "b")
    lapse(store)
    # Then the first is counted now, as good as dead; and after a third the model fails, its jobs with it
    assert check(store) == [("lapsed", 1)]
    loading(store, "c")
    lapse(store)
    assert check(store) == [("died", 0)]
    assert store.redis.hget(keys.model(MODEL), "state") == "failed"


def test_a_worker_found_hung_in_a_models_load_is_counted_at_once(store):
    # Given a worker loading the model, whose keeper stops renewing its lease as hung (blocked, wanting no CPU)
    for n, worker in enumerate("ab", 1):
        loading(store, worker)
        assert (
            store.scripts.run(
                "keep_lease", device=store.settings.device, worker=worker, lease_ms=1000, hung="hung: test"
            )
            == "hung"
        )
        # When the lease lapses
        lapse(store)
        # Then the death is counted at once: the second in a row fails the model
        assert check(store) == ([("retry", 1)] if n == 1 else [("died", 0)])
    assert store.redis.hget(keys.model(MODEL), "error") == "the model failed to load: the worker died while loading it"


def test_a_keeper_that_renews_again_takes_back_its_hung_verdict(store):
    # Given a worker loading the model, found hung by its keeper, that comes back to life within its lease
    worker = loading(store, "a")
    run = store.scripts.run
    device = store.settings.device
    assert run("keep_lease", device=device, worker="a", lease_ms=1000, hung="hung: test") == "hung"
    assert run("keep_lease", device=device, worker="a", lease_ms=1000, hung="") == "ok"
    # When its lease lapses later in the load (a starved machine), and it wakes
    lapse(store)
    assert check(store) == [("lapsed", 0)]
    assert worker.renew_device() == "lapsed"
    # Then nothing was counted against the model
    loading(store, "b")
    lapse(store)
    assert check(store) == [("lapsed", 0)]


def test_a_late_worker_that_finishes_its_load_after_the_next_began_it_writes_nothing(store):
    # Given a worker whose lease lapsed while it loaded the model, and the next worker loading it again
    late = loading(store, "a")
    lapse(store)
    assert check(store) == [("lapsed", 0)]
    after = loading(store, "b")
    # When the late worker finishes its load (before its next renewal tells it the lease lapsed)
    assert late.model_loaded(MODEL, 1.0, 1) is False
    assert late.renew_device() == "b"  # (told another holds the device, it stops)
    # Then the record still says the next worker's load is under way; so when that worker dies in it (its
    # supervisor reaps it), its death is counted
    record = store.redis.hgetall(keys.model(MODEL))
    assert (record["state"], record["worker"]) == ("loading", "b"), record
    assert store.upkeep.drop_device(os.getpid(), died=True) is True
    assert store.redis.hget(keys.WORKER_PREFIX + after.worker, "dead")
    assert check(store) == [("retry", 1)]
