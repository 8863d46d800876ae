"""What every benchmark stands on: a private Redis and a model, the processes a run starts (and always stops) and the
environment they get, clients at once and rounds in turn, jobs admitted and awaited.

Its imports are the standard library and onelane's contract, so a script may gevent-patch before importing it.
Shared beyond this: proc.py (what /proc says about the processes), report.py (the statistics the reports print),
openai_load.py (load through /v1/chat/completions), streaming_load.py (the streaming chat workload), mlx_server.py
(the mlx_lm.server baseline), onelane_overload.py (onelane under the same overload), chat_servers.py (the servers a
conversation is held with) and celery_app.py (the Celery baseline). Every other module of bench/ is a benchmark,
`./dev.sh bench NAME`, whose main() reads setup -> measure -> report; no benchmark imports another.
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bench.proc import children, group_members
from tasks import keys
from tasks.broker import Doorbell
from tasks.embedded_redis import EmbeddedRedis
from tasks.events import TERMINAL
from tasks.job import JobSpec, SamplingParams, new_job_id
from tasks.settings import Settings
from tasks.store import Store

T = TypeVar("T")
START_S = 90.0  # longest wait for a process started here to answer
WORDS = "the queue keeps the gpu busy and users informed a job waits starts streams tokens then ends".split()

# --- a private Redis and a model ------------------------------------------------------------------------------


@contextmanager
def private_redis() -> Iterator[tuple[Path, str]]:
    """A temp folder and a fresh redis-server on a unix socket in it (no AOF): (the folder, its URL)."""
    with tempfile.TemporaryDirectory(prefix="onelane-bench-") as tmp:
        folder = Path(tmp)
        server = EmbeddedRedis(folder / "redis", appendonly=False).start()
        try:
            yield folder, server.url
        finally:
            server.stop()


@contextmanager
def bench_env(size: str = "tiny", model: str | None = None, **overrides: object) -> Iterator[Settings]:
    """A fresh Redis and a model: `model` as a benchmark's `--model` names it (see model_folder), or a random demo
    model of `size`; yields Settings pointing at both (their folder is `var_dir`)."""
    from worker.demo_build.model import make_demo_model

    with private_redis() as (folder, url):
        path = model_folder(model, folder) if model else make_demo_model(folder / f"model-{size}", size=size)
        yield Settings(redis_url=url, model=str(path), var_dir=folder, **overrides)  # type: ignore[arg-type]


def onelane_env(settings: Settings, quiet: bool = False, **extra: str) -> dict[str, str]:
    """The environment of an `onelane` process, pointed at the bench's Redis and model (`quiet`: warnings only)."""
    return {
        **os.environ,
        "REDIS_URL": settings.effective_redis_url,
        "ONELANE_MODEL": settings.model_path,
        "ONELANE_VAR_DIR": str(settings.var_dir),
        "ONELANE_DEVICE": settings.device,
        "PYTHONUNBUFFERED": "1",
        **({"ONELANE_LOG_LEVEL": "WARNING"} if quiet else {}),
        **extra,
    }


def queue_bounds(n: int) -> dict[str, str]:
    """The environment that sets both of the queue's bounds (ONELANE_MAX_QUEUE, and per user) to `n`."""
    return {"ONELANE_MAX_QUEUE": str(n), "ONELANE_MAX_QUEUED_PER_USER": str(n)}


MODEL_HELP = "smollm2 (the default model), demo, or a model folder"


def add_model_option(parser: argparse.ArgumentParser, about: str = MODEL_HELP) -> None:
    """A benchmark's `--model` (see model_folder), the default model unless told otherwise."""
    parser.add_argument("--model", default="smollm2", help=about)


def model_folder(choice: str, folder: Path) -> Path:
    """A benchmark's `--model`: `smollm2` (the default model, SmolLM2-135M-Instruct, imported from its GGUF into
    `folder` as float32, what the worker loads on a CPU), `demo` (worker/demo), or a model folder."""
    from tasks.catalogue import DEFAULT_MODEL, DEFAULT_MODEL_GGUF, SHIPPED_DEMO_MODEL

    if choice == "demo":
        return SHIPPED_DEMO_MODEL
    if choice == "smollm2":
        from worker.gguf import import_gguf, locate

        return import_gguf(locate(DEFAULT_MODEL_GGUF), folder / DEFAULT_MODEL, dtype="float32")
    return Path(choice)


# --- processes ------------------------------------------------------------------------------------------------


@contextmanager
def spawn(
    args: list[str], log_path: Path, env: dict[str, str] | None = None, stop_timeout_s: float = 45.0
) -> Iterator[subprocess.Popen[bytes]]:
    """`args` in a process group of its own, its output appended to `log_path`; stopped on exit (see `stop`)."""
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            args, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield child
        finally:
            stop(child, stop_timeout_s)


def stop(child: subprocess.Popen[bytes], timeout_s: float = 45.0) -> None:
    """SIGTERM `child` (a supervisor then stops its workers), then SIGKILL whatever of its process group is still
    alive (a worker its supervisor orphaned), one pid at a time."""
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            name = " ".join(map(str, child.args[2:4]))  # type: ignore[index]  # e.g. "cli.main worker"
            print(f"  ! {name} (pid {child.pid}) ignored SIGTERM for {timeout_s:.0f} s")
    for _ in range(3):
        left = group_members(child.pid)
        if not left:
            break
        for pid in left:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    if child.poll() is None:
        child.wait(timeout=10)


@contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """`count` processes that each keep one core busy (a pure-Python loop) until the block ends: a machine loaded by
    other work, steady from before anything measured starts."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL, start_new_session=True)
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def onelane_worker(
    settings: Settings, log_path: Path, supervised: bool = True, quiet: bool = False, **extra: str
) -> AbstractContextManager[subprocess.Popen[bytes]]:
    """`onelane worker` (a supervisor, an active worker and a standby), or one `python -m worker.main` alone."""
    args = [sys.executable, "-m", *(["cli.main", "worker"] if supervised else ["worker.main"])]
    return spawn(args, log_path, onelane_env(settings, quiet, **extra))


@contextmanager
def onelane_web(
    settings: Settings,
    port: int,
    log_path: Path,
    workers: int | None = None,
    ready: str = "/healthz",
    quiet: bool = False,
    **extra: str,
) -> Iterator[subprocess.Popen[bytes]]:
    """`onelane web --port P [--workers N]`, up when yielded: `ready` answers 200 and its gunicorn workers run."""
    args = [
        sys.executable,
        "-m",
        "cli.main",
        "web",
        "--port",
        str(port),
        *(["--workers", str(workers)] if workers else []),
    ]
    with spawn(args, log_path, onelane_env(settings, quiet, **extra)) as web:

        def up() -> bool:
            if web.poll() is not None:
                raise RuntimeError(f"onelane web exited ({web.returncode}):\n{tail(log_path)}")
            return answers(port, ready) and len(children(web.pid)) >= (workers or 1)

        if not poll_until(up, START_S):
            raise RuntimeError(
                f"onelane web: no 200 from {ready} within {START_S:.0f} s:\n{tail(log_path)}\n"
                f"{tail(log_path.parent / 'worker.log')}"
            )
        yield web


@dataclass(frozen=True)
class Stack:
    """`onelane worker` and `onelane web`, running: the web's URL and both processes."""

    url: str
    worker: subprocess.Popen[bytes]
    web: subprocess.Popen[bytes]

    @property
    def alive(self) -> bool:
        return self.worker.poll() is None and self.web.poll() is None


@contextmanager
def onelane_stack(
    settings: Settings,
    quiet: bool = False,
    ready: str = "/readyz",
    logs: tuple[Path, Path] | None = None,
    **extra: str,
) -> Iterator[Stack]:
    """`onelane worker` (supervised) and `onelane web` on a free port, both with `extra` in their environment, up
    when yielded; their `logs` (worker's, web's) are worker.log and web.log in the run's folder unless given."""
    worker_log, web_log = logs or (Path(settings.var_dir) / "worker.log", Path(settings.var_dir) / "web.log")
    port = free_port()
    with (
        onelane_worker(settings, worker_log, quiet=quiet, **extra) as worker,
        onelane_web(settings, port, web_log, ready=ready, quiet=quiet, **extra) as web,
    ):
        yield Stack(f"http://127.0.0.1:{port}", worker, web)


def poll_until(check: Callable[[], T], timeout_s: float, every_s: float = 0.1) -> T | None:
    """`check()`'s first true answer, asked every `every_s`; None if none came within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            return None
        time.sleep(every_s)


def free_port() -> int:
    """A loopback port nobody is listening on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_request(
    port: int, method: str, path: str, body: bytes | None = None, timeout: float = 10.0
) -> tuple[int, bytes]:
    """One request to 127.0.0.1:`port` on a fresh connection: (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body is not None else {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def answers(port: int, path: str) -> bool:
    """GET `path` answers 200."""
    try:
        return http_request(port, "GET", path, timeout=2)[0] == 200
    except (OSError, http.client.HTTPException):
        return False


def tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines of the log at `path` (nothing if there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def matching_lines(path: Path, needles: Sequence[str]) -> list[str]:
    """The lines of the log at `path` that hold any of `needles` (none if there is no log)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in text if any(n in line for n in needles)]


# --- clients at once, rounds in turn --------------------------------------------------------------------------


def at_once(n: int, run: Callable[[int], T], name: str = "client") -> list[T]:
    """`run(0)` ... `run(n - 1)`, each on a thread of its own, all at once: their results, in that order."""
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix=name) as pool:
        return list(pool.map(run, range(n)))


def rotated(items: Sequence[T], by: int) -> list[T]:
    """`items` rotated by `by` places: the order of round `by`, so that each goes first in turn and a disturbance
    of this shared machine falls on all alike."""
    k = by % len(items)
    return [*items[k:], *items[:k]]


# --- jobs -----------------------------------------------------------------------------------------------------


def prompt(n: int, words: int = 12) -> str:
    """The n-th of the benchmarks' made-up prompts, `words` words long."""
    return " ".join(WORDS[(n * 7 + k) % len(WORDS)] for k in range(words))


def admit(
    store: Store, broker: Any, owner: str, text: str, model: str | None = None, job_id: str | None = None, **params: Any
) -> str:
    """Admit a job as the web does (the job and its dramatiq message in one script); returns its id."""
    job_id = job_id or new_job_id()
    spec = JobSpec(owner=owner, model=model or store.settings.model_name, prompt=text, params=SamplingParams(**params))
    store.admit(job_id, spec, 600, doorbell=Doorbell.ring(broker, job_id))
    return job_id


def wait_ended(store: Store, ids: list[str], timeout_s: float, every_s: float = 0.05) -> list[str]:
    """Read the jobs' status (one pipeline a round) until every one has ended; returns those that have not."""
    pending = list(ids)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        pipe = store.redis.pipeline(transaction=False)
        for job_id in pending:
            pipe.hget(keys.job(job_id), "status")
        pending = [j for j, status in zip(pending, pipe.execute()) if status not in TERMINAL]
        if pending:
            time.sleep(every_s)
    return pending


class InProcess:
    """A benchmark's parts in this process: the model loaded once, the store and the broker of its private Redis,
    and the real worker started on that model (`worker`) for as long as a part needs it."""

    def __init__(self, settings: Settings) -> None:
        from tasks.broker import make_broker
        from worker.batch.engine import Engine

        self.settings = settings
        self.engine = Engine.load(settings.model_path)
        self.store = Store.connect(settings)
        self.broker = make_broker(settings, worker=False)

    def worker(self, **overrides: Any) -> AbstractContextManager[Any]:
        """The real worker, on the loaded engine, with these settings changed."""
        return running_worker(self.settings.model_copy(update=overrides), self.engine)

    def submit(self, spec: JobSpec, job_id: str | None = None) -> str:
        """Admit a job as the web does (the job and its dramatiq message in one script); returns its id."""
        job_id = job_id or new_job_id()
        self.store.admit(job_id, spec, 600, doorbell=Doorbell.ring(self.broker, job_id))
        return job_id

    def ended(self, ids: list[str], timeout_s: float = 900.0) -> tuple[float, list[Any]]:
        """Wait for the jobs to end: (seconds from the first admission to the last end, the jobs as they ended)."""
        assert not wait_ended(self.store, ids, timeout_s, every_s=0.01), "jobs did not end in time"
        jobs = [self.store.get(job_id) for job_id in ids]
        first = min(j.timings.queued_at for j in jobs)
        return max(j.timings.finished_at for j in jobs) - first, jobs


@dataclass(frozen=True)
class Chunk:
    """One step of a job run alone: the new text, its tokens so far, and the finish reason last."""

    text: str
    tokens: int
    finish_reason: str | None = None


def generate(engine: Any, spec: JobSpec) -> Iterator[Chunk]:
    """One job alone on `engine` (worker/batch/engine.py), start to end, a chunk per token, holding the device's lock as the
        worker's runner does: the baseline of the benchmarks (and the tests' way to run a model without a worker). An answer
    under a grammar draws every token under its mask (no fast-forward) and ends where the grammar does."""
    with engine.lock:
        constraint = engine.grammars.constrain(spec.constraint.grammar) if spec.constraint else None
        uid = engine.insert(engine.prompt_tokens(spec), spec.params, constraint=constraint)
        detokenizer, n = engine.detokenizer(), 0
        try:
            while True:
                tokens = engine.step()
                for t in tokens:
                    n += 1
                    # (its grammar has taken the step's tokens: complete, if at all, at the last of them)
                    done = t is tokens[-1] and constraint is not None and constraint.done
                    reason = "stop" if done else t.finish_reason
                    if t.finish_reason != "stop":
                        detokenizer.add_token(t.token)
                    if reason:
                        detokenizer.finalize()
                    yield Chunk(detokenizer.last_segment, n, reason)
                    if reason:
                        return
        finally:
            if engine.size:
                engine.remove([uid])


@contextmanager
def running_worker(settings: Settings, engine: Any = None) -> Iterator[Any]:
    """The real worker in this process (dramatiq, the writer thread, the listener), started; stopped on exit."""
    from worker.main import GpuWorker

    worker = GpuWorker(settings, engine=engine, on_fatal=lambda why: print("  ! worker:", why))
    assert worker.start()
    try:
        yield worker
    finally:
        worker.stop()
