"""A real Prometheus (Debian's `prometheus`, installed by ./dev.sh test) scrapes /metrics: it must parse every line,
or the target is down and the story fails with Prometheus's own reason."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import IN_CI, free_port
from tests.helpers import wait_ended
from tests.test_health import scrape

DEADLINE_S = 30.0


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """Start a Prometheus scraping one URL's /metrics every 0.5 s, its storage in tmp_path; yields a starter that
    returns its API's base URL. Stopped at the end."""
    binary = shutil.which("prometheus")
    if binary is None:
        if IN_CI:
            pytest.fail("CI needs prometheus (./dev.sh test installs it)")
        pytest.skip("no prometheus on this machine (apt install prometheus)")
    started: list[subprocess.Popen[bytes]] = []

    def start(target: str) -> str:
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "scrape_configs:\n"
            "  - job_name: onelane\n"
            "    scrape_interval: 500ms\n"
            "    scrape_timeout: 500ms\n"
            f"    static_configs: [{{targets: ['{target.removeprefix('http://')}']}}]\n"
        )
        port = free_port()
        log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 (closed with the process)
        started.append(
            subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=log,
            )
        )
        log.close()
        return f"http://127.0.0.1:{port}"

    yield start
    for process in started:
        process.terminate()
        process.wait(timeout=30)


def scraped(api: str) -> dict[str, Any]:
    """Poll Prometheus's API until it has scraped its one target: the target as its API reports it. A target that
    Prometheus found down (its scrape failed: unparsable metrics, say) fails the story with its error."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            answer = requests.get(f"{api}/api/v1/targets", timeout=5)
        except requests.ConnectionError:  # not listening yet
            answer = None
        targets = answer.json()["data"]["activeTargets"] if answer and answer.ok else []  # (503 while starting)
        for target in targets:
            assert target["health"] != "down", f"Prometheus could not scrape /metrics: {target['lastError']}"
            if target["health"] == "up":
                return target  # type: ignore[no-any-return]
        time.sleep(0.05)  # a poll of another process's API, bounded by the deadline
    pytest.fail(f"Prometheus did not scrape its target within {DEADLINE_S:g} s")


def query(api: str, promql: str) -> dict[str, float]:
    """An instant query: each series' value, by its labels (as "name{k=v,...}")."""
    answer = requests.get(f"{api}/api/v1/query", params={"query": promql}, timeout=5).json()
    assert answer["status"] == "success", answer
    found = {}
    for series in answer["data"]["result"]:
        labels = ",".join(f"{k}={v}" for k, v in sorted(series["metric"].items()) if k not in ("job", "instance"))
        found[labels] = float(series["value"][1])
    return found


def test_a_real_prometheus_scrapes_every_metric_after_a_job_ran(jobs, store, start_worker, live_server, prometheus):
    # Given a job that ran to its end, 5 tokens
    start_worker()
    job = jobs.submit("scraped", max_tokens=5, ignore_eos=True)
    assert wait_ended(store, job["id"])["status"] == "completed"

    # When Prometheus scrapes /metrics
    api = prometheus(live_server)
    target = scraped(api)

    # Then it took every line, and reads the counters, gauges and histograms as /metrics meant them
    assert target["lastError"] == ""
    assert query(api, "up") == {"__name__=up": 1.0}
    assert query(api, "onelane_tokens_generated_total")["__name__=onelane_tokens_generated_total"] == 5
    finished = query(api, "onelane_jobs_finished_total")
    assert finished["__name__=onelane_jobs_finished_total,status=completed"] == 1
    assert query(api, "sum(onelane_job_duration_seconds_bucket{le='900'})") == {"": 1.0}
    assert len(query(api, "onelane_batch_occupancy_ratio")) == 1
    assert query(api, "scrape_samples_scraped") == {"__name__=scrape_samples_scraped": len(scrape(jobs.client))}
