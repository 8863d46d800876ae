"""onelane's private redis-server, used when REDIS_URL is unset: loopback only (a unix socket), AOF on.

One process at a time runs the Redis of a folder: it holds an flock on the folder's lock file from before its
redis-server starts until after it stopped (the OS lets go when the process dies, however), so a second `onelane up`
or `onelane redis` there is refused before it touches anything: a redis-server started on the same socket would
unlink the first one's, and cut its clients off for good. The lock file names the owner and its redis-server: one
that outlived its owner (killed with its terminal, while Redis runs in a session of its own) is stopped by the next
owner, its data kept in its AOF; any other Redis answering on the socket refuses the start.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

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


class RedisInUse(OnelaneError):
    """Another process runs the Redis of this folder, or another Redis answers on its socket."""

    type = "redis_in_use"


OTHER_FOLDER = "give this one its own folder: ONELANE_VAR_DIR=/other/dir"


class FolderLock:
    """The right to run the Redis of a folder: an flock on its lock file, with the owner's pid and its
    redis-server's written in it (JSON)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "onelane.lock"
        self.fd: int | None = None

    def acquire(self, url: str) -> dict[str, int | None]:
        """Take the lock (RedisInUse, naming the holder, if another process has it); what the last owner wrote."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_record(fd).get("pid")
            os.close(fd)
            who = f"another onelane (pid {holder})" if holder else "another onelane"
            raise RedisInUse(
                f"{who} runs its Redis in {self.path.parent}; stop it, or {OTHER_FOLDER} "
                f"(or REDIS_URL={url} to share that Redis)"
            ) from None
        self.fd = fd
        last = _read_record(fd)
        self.write(last.get("redis_pid"))  # (until its own starts: the one left behind, if any, is still to stop)
        return last

    def write(self, redis_pid: int | None) -> None:
        assert self.fd is not None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps({"pid": os.getpid(), "redis_pid": redis_pid}).encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # (which lets go of the flock)
            self.fd = None


def _read_record(fd: int) -> dict[str, int | None]:
    """What a lock file says (nothing if it was never written whole)."""
    try:
        record = json.loads(os.pread(fd, 256, 0) or b"{}")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _listening(path: Path) -> bool:
    """Whether a server listens on the unix socket `path` (a file left by one that died is no server)."""
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            return False
    return True


class EmbeddedRedis:
    """A redis-server child process with its data in `directory`, on a unix socket or a loopback port."""

    def __init__(self, directory: Path, port: int | None = None, appendonly: bool = True) -> None:
        self.directory = Path(directory).resolve()
        self.port = port
        self.appendonly = appendonly
        self.process: subprocess.Popen[bytes] | None = None
        self.lock = FolderLock(self.directory)

    @property
    def socket(self) -> Path:
        return self.directory / "redis.sock"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}" if self.port else f"unix://{self.socket}"

    def start(self, timeout_s: float = 10.0) -> EmbeddedRedis:
        """Start redis-server, unless another process runs this folder's Redis (RedisInUse: nothing is touched)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        last = self.lock.acquire(f"unix://{self.socket}")
        try:
            self._clear_socket(last.get("redis_pid"))
            self._spawn(timeout_s)
        except BaseException:
            self.stop()
            raise
        logger.info("redis-server running at %s (data in %s)", self.url, self.directory)
        return self

    def _clear_socket(self, left_behind: int | None) -> None:
        """Make sure no other Redis answers on the socket: the one a onelane that died left running is shut down (its
        AOF holds its data; two servers must never write one folder's), any other refuses the start."""
        if not _listening(self.socket):
            return
        # no retries: SHUTDOWN's answer is the connection closing, which must not be taken for a hiccup
        client = redis.Redis(unix_socket_path=str(self.socket), socket_timeout=10, retry=Retry(NoBackoff(), 0))
        try:
            pid = int(client.info("server")["process_id"])
        except redis.RedisError:
            pid = None
        try:
            if pid is None or pid != left_behind:
                who = f" (pid {pid})" if pid else ""
                raise RedisInUse(
                    f"a Redis not started by onelane{who} answers on {self.socket}; stop it, or share it: "
                    f"REDIS_URL=unix://{self.socket}, or {OTHER_FOLDER}"
                )
            logger.warning(
                "stopping the redis-server (pid %d) a onelane that died left running in %s", pid, self.directory
            )
            client.shutdown()
        finally:
            client.close()
        deadline = time.monotonic() + 10
        while _listening(self.socket):  # it removes its socket as it exits
            if time.monotonic() > deadline:
                raise RedisInUse(f"the redis-server (pid {pid}) left running in {self.directory} did not stop")
            time.sleep(0.02)  # a poll: another process's exit announces nothing here

    def _spawn(self, timeout_s: float) -> None:
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
        self.lock.write(self.process.pid)  # so that the next owner knows it, should this process die first
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

    def stop(self) -> None:
        """Stop redis-server, then let go of the folder."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.lock.release()
