"""Images at the door (issue 60): what a crafted or heavy image costs the web's other requests, and what refused image
requests leave in Redis.

    ./dev.sh bench image_door [--root TREE] [--rounds 2]

`--root` runs the web of another source tree (a checkout of an earlier commit, say) against the same workload, so the
same script measures before and after. Each run starts a private Redis and `onelane web` (gunicorn + gevent, one
process) serving a model folder whose config reads images (a Gemma 3 processor's 896 x 896: no worker loads it, the
door alone is measured), with ONELANE_MAX_QUEUED_PER_USER 1. Per round:

1. /healthz asked one request after another for 3 s alone (the machine's own noise), then while a JPEG of 4096 x 4096
   pixels and 20,000 scans (692 KB) is sent to /v1/jobs: /healthz's longest and median wait, the bomb's status and
   time, and whether the web's gunicorn worker was killed (its pid changed);
2. the same while four 4096 x 4096 PNGs (about 100 KiB each) are sent in one request;
3. Redis: the four PNGs' job waits (the quota is full), then ten requests of a 7.7 MB image each are refused: Redis's
   used_memory and used_memory_dataset before, just after, and 10 s after, and the image keys left (and their TTL).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis
import requests

from bench.harness import free_port, poll_until, private_redis, stop, tail
from bench.proc import children
from tests.test_image_reader import big_png, scan_bomb
from tests.test_image_store import noise

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the source tree whose web is measured")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    bomb, pngs = scan_bomb(), [big_png(seed) for seed in range(4)]
    pictures = [noise(1600, seed) for seed in range(10)]
    print(f"tree {args.root}; load {os.getloadavg()[0]:.1f}; bomb {len(bomb)} B; PNGs {sum(map(len, pngs))} B")
    with private_redis() as (folder, url), tempfile.TemporaryDirectory() as tmp:
        models = models_file(Path(tmp))
        client = redis.Redis.from_url(url)
        for n in range(args.rounds):
            client.flushall()
            with web(args.root, url, models, folder / f"web-{n}.log") as (base, process):
                print(f"round {n + 1}")
                alone = healthz_alone(base)
                for name, body in (
                    ("scan bomb", [(bomb, "image/jpeg")]),
                    ("four PNGs", [(p, "image/png") for p in pngs]),
                ):
                    before = children(process.pid)
                    waits, status, took = while_sent(base, body)
                    killed = children(process.pid) != before
                    print(
                        f"  {name}: /healthz longest {max(waits):.3f} s, median {statistics.median(waits):.3f} s "
                        f"({len(waits)} asked; alone: longest {alone:.3f} s); answered {status} in {took:.1f} s"
                        + ("; the web's worker was killed" if killed else "")
                    )
                    alone = healthz_alone(base)
                memory(base, client, pictures)


def models_file(folder: Path) -> Path:
    eyes = folder / "eyes"
    eyes.mkdir()
    (eyes / "config.json").write_text(json.dumps({"model_type": "gemma3", "vision_config": {}}))
    (eyes / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 896, "width": 896}}))
    path = folder / "models.toml"
    path.write_text(f'[models.eyes]\npath = "{eyes}"\ndefault = true\n')
    return path


class web:
    """`onelane web` of the tree `root`, up: (its URL, its process)."""

    def __init__(self, root: Path, url: str, models: Path, log: Path) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in ("ONELANE_MODEL", "PYTHONPATH")}
        env |= {"REDIS_URL": url, "ONELANE_MODELS_FILE": str(models), "ONELANE_VAR_DIR": str(log.parent)}
        env |= {"ONELANE_MAX_QUEUED_PER_USER": "1", "ONELANE_LOG_LEVEL": "WARNING"}
        self.log = log
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "web", "--port", str(self.port)],
                cwd=root,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def __enter__(self) -> tuple[str, subprocess.Popen[bytes]]:
        base = f"http://127.0.0.1:{self.port}"

        def up() -> bool:
            assert self.process.poll() is None, tail(self.log)
            try:
                return requests.get(f"{base}/healthz", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False

        assert poll_until(up, 60), tail(self.log)
        return base, self.process

    def __exit__(self, *_: object) -> None:
        stop(self.process)


def submit(base: str, images: list[tuple[bytes, str]]) -> requests.Response:
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{base64.b64encode(data).decode()}"}}
        for data, mime in images
    ]
    parts.append({"type": "text", "text": "What is this?"})
    body = {"model": "eyes", "messages": [{"role": "user", "content": parts}], "max_tokens": 4, "ttl_s": 60}
    return requests.post(f"{base}/v1/jobs", json=body, timeout=300)


def healthz_alone(base: str, seconds: float = 3.0) -> float:
    waits, until = [], time.monotonic() + seconds
    while time.monotonic() < until:
        began = time.monotonic()
        requests.get(f"{base}/healthz", timeout=300)
        waits.append(time.monotonic() - began)
    return max(waits)


def while_sent(base: str, images: list[tuple[bytes, str]]) -> tuple[list[float], int | str, float]:
    """/healthz's waits while `images` are sent in one request; the request's status and time."""
    answer: list[int | str] = []
    began = time.monotonic()

    def send() -> None:
        try:
            answer.append(submit(base, images).status_code)
        except requests.RequestException as exc:
            answer.append(type(exc).__name__)

    sender = threading.Thread(target=send)
    sender.start()
    waits = []
    while True:
        ended = not sender.is_alive()
        asked = time.monotonic()
        with contextlib.suppress(requests.RequestException):  # (the web's worker killed: a wait all the same)
            requests.get(f"{base}/healthz", timeout=300)
        waits.append(time.monotonic() - asked)
        if ended:
            sender.join()
            return waits, answer[0], time.monotonic() - began


def memory(base: str, client: redis.Redis, pictures: list[bytes]) -> None:
    # (the four PNGs' job waits: the quota, 1, is full)
    info = lambda: client.info("memory")  # noqa: E731
    before = info()
    statuses = [submit(base, [(p, "image/png")]).status_code for p in pictures]
    just_after = info()
    time.sleep(10)  # (what Redis keeps once its client cron has freed idle buffers)
    later = info()
    images = list(client.keys("onelane:image:*"))
    ttls = sorted({client.ttl(k) for k in images})
    mb = lambda i, k="used_memory": i[k] / 1e6  # noqa: E731
    print(
        f"  ten refused image requests ({sum(map(len, pictures)) / 1e6:.1f} MB; answered {sorted(set(statuses))}): "
        f"used_memory {mb(before):.1f} -> {mb(just_after):.1f} -> {mb(later):.1f} MB 10 s later; dataset "
        f"{mb(before, 'used_memory_dataset'):.1f} -> {mb(later, 'used_memory_dataset'):.1f} MB; image keys left "
        f"{len(images)} (TTLs {ttls[:4]} s: the four PNGs' job's, admitted, and any other)"
    )


if __name__ == "__main__":
    main()
