"""The servers a chat conversation is held with, for multiturn.py and conversations.py: onelane with an API key per
user (its prefix cache on or off), onelane on two devices, or mlx_lm.server, each as one `Server` record; and the
conversation's questions and long system message."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import (
    START_S,
    bench_env,
    free_port,
    onelane_stack,
    onelane_web,
    onelane_worker,
    poll_until,
    queue_bounds,
)
from bench.mlx_server import eos_id, mlx_server
from tasks.settings import Settings
from tasks.store import Store

QUESTIONS = [
    "What is a queue, and why would a GPU need one?",
    "Who waits in it, and how do they know where they stand?",
    "What happens when the worker dies in the middle of an answer?",
    "And when a user leaves before their answer starts?",
    "How does the queue stay fair between a busy user and a quiet one?",
    "Sum it up in one sentence.",
    "One more thing: what should I read next?",
    "Thank you. Anything to add?",
]
SYSTEM_SENTENCES = [
    "You are the help desk of a shared GPU that many people use through one queue.",
    "Answer briefly, in plain words, and say when you do not know.",
    "The queue admits jobs into Redis, each with a deadline, and one worker generates on the device.",
    "Jobs that expired, were cancelled, or whose client left are skipped before generation.",
    "Users see their position and an estimate of when they will start; results stream back as they are made.",
    "When the queue is full it sheds load with a clear answer and a time to retry.",
]


def system_message(chars: int) -> str:
    text, n = "", 0
    while len(text) < chars:
        text += SYSTEM_SENTENCES[n % len(SYSTEM_SENTENCES)] + " "
        n += 1
    return text.strip()


@dataclass
class Server:
    name: str
    url: str
    eos: int | None = None  # mlx_lm.server: the EOS its requests push down
    keys: list[str] = field(default_factory=list)  # onelane: one API key per user
    store: Store | None = None
    folder: Path | None = None
    model: str = ""  # onelane: the model's name (a path given as ONELANE_MODEL is served under it)


def user_keys(n: int) -> list[str]:
    return [f"bench-user-{u}-key-0123456789" for u in range(n)]


def stack_env(keys: list[str], **more: str) -> dict[str, str]:
    """What every onelane process of a run is started with: wide queue bounds, a key per user, long answers."""
    return {
        **queue_bounds(1000),
        "ONELANE_API_KEYS": ",".join(f"u{n}:{k}" for n, k in enumerate(keys)),
        "ONELANE_MAX_TOKENS_LIMIT": "4096",
        **more,
    }


@contextlib.contextmanager
def serving(name: str, settings: Settings, url: str, keys: list[str]) -> Iterator[Server]:
    """The running stack at `url` as a Server, with a store of its own on its Redis."""
    store = Store.connect(settings)
    try:
        yield Server(name, url, keys=keys, store=store, folder=settings.var_dir, model=settings.model_name)
    finally:
        store.redis.close()


@contextlib.contextmanager
def onelane(model: str, users: int, cache: bool, log: Path) -> Iterator[Server]:
    """A fresh Redis, `onelane worker` and `onelane web`, with a key per user; the prefix cache on or off."""
    keys = user_keys(users)
    extra = stack_env(keys, ONELANE_PREFIX_CACHE=os.environ.get("ONELANE_PREFIX_CACHE", "10%") if cache else "0")
    logs = (log.with_suffix(".worker.log"), log.with_suffix(".web.log"))
    with (
        bench_env(model=model) as settings,
        onelane_stack(settings, logs=logs, **extra) as stack,
        serving("onelane" if cache else "onelane, no cache", settings, stack.url, keys) as server,
    ):
        yield server


@contextlib.contextmanager
def two_devices(model: str, users: int, affinity_s: float, log: Path) -> Iterator[Server]:
    """onelane with two workers on two devices of one Redis (as two GPUs would be), steering by cache or not."""
    keys = user_keys(users)
    extra = stack_env(keys, ONELANE_CACHE_AFFINITY_S=str(affinity_s))
    with bench_env(model=model) as settings:
        port = free_port()
        with (
            onelane_worker(settings, log.with_suffix(".a.log"), ONELANE_DEVICE="gpu-a", **extra),
            onelane_worker(settings, log.with_suffix(".b.log"), ONELANE_DEVICE="gpu-b", **extra),
            onelane_web(settings, port, log.with_suffix(".web.log"), ready="/readyz", **extra),
            serving(
                f"onelane, 2 devices, steering {'on' if affinity_s else 'off'}",
                settings,
                f"http://127.0.0.1:{port}",
                keys,
            ) as server,
        ):
            readings = server.store.readings  # type: ignore[union-attr]
            if not poll_until(lambda: len([w for w in readings.snapshot().workers if w.models]) == 2, START_S):
                raise RuntimeError("the two workers did not both come up")
            yield server


@contextlib.contextmanager
def baseline(model: str, log: Path) -> Iterator[Server]:
    with mlx_server(model, log) as server:
        yield Server("mlx_lm.server", server.url, eos=eos_id(model))


def auth(server: Server, user: int) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.keys[user]}"} if server.keys else {}
