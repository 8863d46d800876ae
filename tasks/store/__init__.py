"""The only code that talks to Redis about jobs, a module per audience, all on one connection:

    jobs.py      Store: the web's verbs (admit, get, read, list, cancel, standing, events) and the way to the rest
    worker.py    WorkerStore: one worker process's verbs, bound to its id (lease, claim, append, finish, hand back)
    readings.py  Readings: what health checks, /metrics and the dashboard read (only reads)
    upkeep.py    Upkeep: housekeeping rounds, the doorbell, the supervisor's look at the device, the counters
    images.py    what admission sends of a request's images (kept only for admitted jobs), and its refusals

Every change that must not interleave with another is one Lua script, run by name (tasks/scripts.py).
"""

from tasks.store.jobs import Standing, Store
from tasks.store.readings import Board, BoardEntry, DeviceLease, Minute, ModelState, Reading, Readings
from tasks.store.upkeep import Upkeep
from tasks.store.worker import BatchReport, Claim, Delivered, Switch, WorkerStore

__all__ = [
    "BatchReport",
    "Board",
    "Claim",
    "Delivered",
    "DeviceLease",
    "Minute",
    "ModelState",
    "Readings",
    "Reading",
    "Standing",
    "Store",
    "Switch",
    "Upkeep",
    "BoardEntry",
    "WorkerStore",
]
