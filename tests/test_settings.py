"""Settings are read once, validated, and a bad value stops the process with a message naming it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tasks import keys
from tasks.catalogue import DEFAULT_MODEL
from tasks.errors import SettingsError
from tasks.settings import ENV_NAMES, Settings
from tasks.users import turn_share
from tests.helpers import claim_now


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
        ({"ONELANE_LOG_LEVEL": "loud"}, "ONELANE_LOG_LEVEL"),
        ({"ONELANE_OPENBLAS": "maybe"}, "ONELANE_OPENBLAS"),
        ({"ONELANE_GEMV": "maybe"}, "ONELANE_GEMV"),
        ({"ONELANE_GEMV_THREADS": "0"}, "ONELANE_GEMV_THREADS"),
        ({"ONELANE_GEMV_THREADS": "3"}, "ONELANE_GEMV_THREADS"),
        ({"ONELANE_MODEL": "x", "ONELANE_MODELS_FILE": "/nonexistent.toml"}, "ONELANE_MODELS_FILE"),
        ({"ONELANE_MODELS_MEMORY": "12 parsecs"}, "ONELANE_MODELS_MEMORY"),
        ({"ONELANE_MODELS_MEMORY": "150%"}, "ONELANE_MODELS_MEMORY"),
        ({"ONELANE_MODEL_SWITCH_WAIT_S": "-1"}, "ONELANE_MODEL_SWITCH_WAIT_S"),
        ({"ONELANE_BATCH_COST": "0"}, "ONELANE_BATCH_COST"),
        ({"ONELANE_MODEL_RETRY_S": "0"}, "ONELANE_MODEL_RETRY_S"),
    ],
)
def test_bad_setting_is_refused_naming_the_variable(env, name):
    with pytest.raises(SettingsError, match=name):
        Settings.from_env(env)


def test_log_level_in_any_case_and_openblas_as_a_boolean():
    assert (Settings.from_env({}).log_level, Settings.from_env({}).openblas) == ("INFO", True)
    s = Settings.from_env({"ONELANE_LOG_LEVEL": "debug", "ONELANE_OPENBLAS": "false"})
    assert (s.log_level, s.openblas) == ("DEBUG", False)
    assert not Settings.from_env({"ONELANE_OPENBLAS": "0"}).openblas  # what turned it off before it was a setting
    with pytest.raises(SettingsError, match="ONELANE_LOG_LEVEL='verbose': Input should be 'DEBUG', 'INFO'"):
        Settings.from_env({"ONELANE_LOG_LEVEL": "verbose"})
    with pytest.raises(SettingsError, match="ONELANE_OPENBLAS='maybe': Input should be a valid boolean"):
        Settings.from_env({"ONELANE_OPENBLAS": "maybe"})


def test_worker_refuses_to_start_with_max_batch_zero(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "worker"],
        env={"ONELANE_MAX_BATCH": "0", "PATH": "/usr/bin:/bin", "ONELANE_VAR_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "ONELANE_MAX_BATCH" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_models_file_names_each_model_with_its_pinned_load_options(tmp_path):
    (tmp_path / "models.toml").write_text(
        '[models.chat]\npath = "mlx-community/Qwen3-4B-4bit"\n'
        '[models.sql]\npath = "./local/sql"\nadapter_path = "/adapters/sql"\nmax_batch = 4\nmax_kv_size = 4096\n'
        "default = true\nmodel_config = {rope_theta = 1000}\n"
    )
    s = Settings.from_env({"ONELANE_MODELS_FILE": str(tmp_path / "models.toml"), "ONELANE_MODELS_MEMORY": "1.5GiB"})

    assert [m.name for m in s.catalog] == ["chat", "sql"] and s.model_name == "sql"
    sql = s.model_named("sql")
    assert sql is not None and sql.path == str(tmp_path / "local" / "sql")  # relative to the file
    assert sql.load_options()["adapter_path"] == "/adapters/sql"
    assert sql.load_options()["model_config"] == {"rope_theta": 1000}
    assert (sql.max_batch, sql.max_kv_size) == (4, 4096)
    assert s.models_memory == 1536 * 2**20
    assert Settings.from_env({"ONELANE_MODEL": "some/model"}).catalog[0].name == "some/model"  # one model, as before
    assert Settings.from_env({}).model_name == DEFAULT_MODEL  # no models file: the catalog's default model


@pytest.mark.parametrize(
    "text,problem",
    [
        ("", "names no model"),
        ('[models.a]\npath = "x"\nbogus = 1\n', "models.a.bogus"),
        ('[models.a]\npath = "x"\nmax_batch = 0\n', "models.a.max_batch"),
        ('[models.a]\nadapter_path = "x"\n', "models.a.path"),
        ('[models.a]\npath = "x"\ndefault = true\n[models.b]\npath = "y"\ndefault = true\n', "only one model"),
        ('[models."a,b"]\npath = "x"\n', "models.a,b.name"),
        ("[models\n", "ONELANE_MODELS_FILE"),
    ],
)
def test_a_bad_models_file_stops_the_process_naming_the_file_model_and_key(tmp_path, text, problem):
    (tmp_path / "models.toml").write_text(text)
    with pytest.raises(SettingsError, match="ONELANE_MODELS_FILE") as refused:
        Settings.from_env({"ONELANE_MODELS_FILE": str(tmp_path / "models.toml")})
    assert problem in str(refused.value)


def test_setting_one_model_and_a_models_file_is_refused(tmp_path):
    (tmp_path / "models.toml").write_text('[models.a]\npath = "x"\n')
    with pytest.raises(SettingsError, match="not both"):
        Settings.from_env({"ONELANE_MODEL": "x", "ONELANE_MODELS_FILE": str(tmp_path / "models.toml")})


def test_a_keys_file_gives_users_weights_and_a_class(tmp_path):
    (tmp_path / "keys.toml").write_text(
        '[users.a]\nkey = "ka"\nweight = 3\n[users.b]\nkey = "kb"\npriority = "batch"\n'
    )
    s = Settings.from_env({"ONELANE_API_KEYS_FILE": str(tmp_path / "keys.toml")})
    turns = [("a", "interactive"), ("b", "interactive"), ("b", "batch")]
    assert [turn_share(s.user_named(name), kind, s.batch_cost) for name, kind in turns] == [1 / 3, 1, 10]
    assert s.user_named("b").priority == "batch"  # type: ignore[union-attr]
    (tmp_path / "keys.toml").write_text('[users.a]\nkey = "ka"\nweight = 0\n')
    with pytest.raises(SettingsError, match="ONELANE_API_KEYS_FILE: users.a.weight"):
        Settings.from_env({"ONELANE_API_KEYS_FILE": str(tmp_path / "keys.toml")})


#: Every numeric setting (read from the fields, so a new one is covered without editing this list), and by name the
#: two whose infinity once passed, should the fields' reading ever miss them
NUMERIC = sorted(
    {ENV_NAMES[f] for f, info in Settings.model_fields.items() if info.annotation in (int, float)}
    | {"ONELANE_JOB_TIME_LIMIT", "ONELANE_STALL_S"}
)
HUGE = "1" + "0" * 30  # an integer no Redis command, Lua script or sleep can take


@pytest.mark.parametrize("value", ["inf", "nan", "1e30", HUGE, "-1"], ids=["inf", "nan", "1e30", "10**30", "-1"])
@pytest.mark.parametrize("name", NUMERIC)
def test_every_numeric_setting_must_be_finite_and_in_its_range(name, value):
    # Given a numeric variable set to infinity, not-a-number, a huge or a negative value
    # Then start-up stops, naming it (ONELANE_JOB_TIME_LIMIT=inf once passed, and then no job could start)
    with pytest.raises(SettingsError, match=f"{name}="):
        Settings.from_env({name: value})


@pytest.mark.parametrize("value", ["inf", "nan", "1e30", HUGE, "-1"], ids=["inf", "nan", "1e30", "10**30", "-1"])
@pytest.mark.parametrize(
    "variable,entry,key",
    [
        ("ONELANE_API_KEYS_FILE", '[users.a]\nkey = "ka"', "max_queued"),
        ("ONELANE_API_KEYS_FILE", '[users.a]\nkey = "ka"', "weight"),
        ("ONELANE_MODELS_FILE", '[models.a]\npath = "x"', "max_batch"),
        ("ONELANE_MODELS_FILE", '[models.a]\npath = "x"', "max_kv_size"),
    ],
    ids=["users.max_queued", "users.weight", "models.max_batch", "models.max_kv_size"],
)
def test_every_number_of_a_keys_or_models_file_must_be_finite_and_in_its_range(tmp_path, variable, entry, key, value):
    (tmp_path / "file.toml").write_text(f"{entry}\n{key} = {value}\n")
    with pytest.raises(SettingsError, match=f"{variable}: (users|models).a.{key}: "):
        Settings.from_env({variable: str(tmp_path / "file.toml")})


def test_the_largest_settings_in_range_still_run_a_job_through_redis(store):
    # Given every time bound at the top of its range (a week to run, a week to wait, 30 days kept)
    from tasks.job import JobSpec, JobStatus

    longest = store.settings.model_copy(
        update={
            "job_time_limit_s": 7 * 86400.0,
            "job_ttl_s": 7 * 86400.0,
            "result_ttl_s": 30 * 86400,
            "stall_s": 86400.0,
            "lease_s": 60.0,
        }
    )
    big = type(store)(store.redis, longest)
    # When a job is admitted, claimed, handed back, claimed again and finished
    big.admit("job_1", JobSpec(owner="u", model=longest.model_name, prompt="hi"), longest.job_ttl_s)
    assert big.for_worker("w").take_device() == "ok"
    assert claim_now(big, "w").id == "job_1"
    assert 0 < store.redis.ttl(keys.job("job_1")) <= (7 + 30) * 86400  # running: its time limit + the result TTL
    big.for_worker("w").hand_back("job_1")
    assert claim_now(big, "w").id == "job_1"
    assert big.for_worker("w").finish("job_1", JobStatus.COMPLETED, finish_reason="stop")
    # Then every Redis expiry it set was accepted, and none outlives its bound (the run's life: a week + 30 days)
    assert big.get("job_1").status is JobStatus.COMPLETED
    assert 0 < store.redis.ttl(keys.job("job_1")) <= 30 * 86400
