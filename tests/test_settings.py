"""Settings are read once, validated, and a bad value stops the process with a message naming it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tasks.errors import SettingsError
from tasks.settings import Settings


def test_defaults_are_safe():
    s = Settings.from_env({})
    assert (s.job_ttl_s, s.result_ttl_s, s.host, s.port) == (600, 3600, "127.0.0.1", 8000)
    assert (s.max_batch, s.kv_budget_tokens, s.prefill_step) == (32, 65536, 128)
    assert s.effective_redis_url.startswith("unix://") and s.effective_redis_url.endswith("var/redis/redis.sock")


@pytest.mark.parametrize(
    "env,name",
    [
        ({"ONELANE_MAX_BATCH": "0"}, "ONELANE_MAX_BATCH"),
        ({"ONELANE_MAX_BATCH": "-3"}, "ONELANE_MAX_BATCH"),
        ({"ONELANE_MAX_BATCH": "two"}, "ONELANE_MAX_BATCH"),
        ({"ONELANE_KV_BUDGET": "0"}, "ONELANE_KV_BUDGET"),
        ({"ONELANE_PREFILL_STEP": "1"}, "ONELANE_PREFILL_STEP"),
        ({"ONELANE_MAX_CONCURRENT": "1"}, "ONELANE_MAX_BATCH"),  # retired: it names what replaced it
        ({"ONELANE_JOB_TTL": "0"}, "ONELANE_JOB_TTL"),
        ({"ONELANE_JOB_TTL": "soon"}, "ONELANE_JOB_TTL"),
        ({"ONELANE_RESULT_TTL": "-1"}, "ONELANE_RESULT_TTL"),
        ({"ONELANE_PORT": "70000"}, "ONELANE_PORT"),
        ({"REDIS_URL": "localhost:6379"}, "REDIS_URL"),
    ],
)
def test_bad_setting_is_refused_naming_the_variable(env, name):
    with pytest.raises(SettingsError, match=name):
        Settings.from_env(env)


def test_worker_refuses_to_start_with_max_batch_zero(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tasks.cli", "worker"],
        env={"ONELANE_MAX_BATCH": "0", "PATH": "/usr/bin:/bin", "ONELANE_VAR_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "ONELANE_MAX_BATCH" in result.stderr
    assert "Traceback" not in result.stderr
