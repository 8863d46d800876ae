"""onelane's private redis-server, used when REDIS_URL is unset: loopback only (a unix socket), AOF on."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

import redis

from tasks.errors import OnelaneError

logger = logging.getLogger(__name__)


class RedisUnavailable(OnelaneError):
    """No redis-server binary, and none could be installed."""

    type = "redis_unavailable"


def redis_binary(install: bool = True) -> str:
    """The redis-server binary; installs Debian's package when missing and allowed (root with apt-get)."""
    found = shutil.which("redis-server")
    if found:
        return found
    if install and shutil.which("apt-get") and os.geteuid() == 0:
        logger.info("redis-server not found: installing Debian's redis-server package")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "redis-server"]):
            subprocess.run(cmd, env=env, check=False, stdout=subprocess.DEVNULL)
        found = shutil.which("redis-server")
        if found:
            return found
    raise RedisUnavailable(
        "redis-server was not found and could not be installed. Install it (Debian/Ubuntu: "
        "`sudo apt-get install redis-server`, macOS: `brew install redis`) or point REDIS_URL at a Redis 7 server."
    )


class EmbeddedRedis:
    """A redis-server child process with its data in `directory`, on a unix socket or a loopback port."""

    def __init__(self, directory: Path, port: int | None = None, appendonly: bool = True) -> None:
        self.directory = Path(directory).resolve()
        self.port = port
        self.appendonly = appendonly
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.directory / "redis.sock"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}" if self.port else f"unix://{self.socket}"

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        self.directory.mkdir(parents=True, exist_ok=True)
        listen = ["--port", str(self.port), "--bind", "127.0.0.1"] if self.port else ["--port", "0"]
        args = [
            redis_binary(),
            *listen,
            "--unixsocket",
            str(self.socket),
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.directory),
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--protected-mode",
            "yes",
            # job records (with their spec of a few hundred bytes) stay in Redis's compact hash encoding
            "--hash-max-listpack-value",
            "1024",
            "--logfile",
            str(self.directory / "redis.log"),
        ]
        # in a session of its own: a Ctrl-C in the terminal must not stop Redis under the processes that still
        # write to it while they stop (a worker draining its batch); whoever started it stops it, last
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True)
        client = redis.Redis(unix_socket_path=str(self.socket))
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client.ping()
                break
            except (redis.ConnectionError, FileNotFoundError):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RedisUnavailable(f"redis-server did not start; see {self.directory / 'redis.log'}") from None
                time.sleep(0.02)
        client.close()
        logger.info("redis-server running at %s (data in %s)", self.url, self.directory)
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
