"""The shipped demo model (worker/demo/): served by default, small, and it writes words of its corpus."""

from __future__ import annotations

import pytest

from bench.harness import generate
from tasks.catalogue import SHIPPED_DEMO_MODEL
from tasks.job import JobSpec, Message, SamplingParams
from tasks.settings import Settings
from worker.demo_build import corpus as demo_corpus

MAX_BYTES = 10 * 1024 * 1024


@pytest.fixture(scope="module")
def shipped():  # type: ignore[no-untyped-def]
    from worker.batch.engine import Engine

    return Engine.load(str(SHIPPED_DEMO_MODEL))


@pytest.fixture(scope="module")
def vocabulary() -> set[str]:
    return demo_corpus.vocabulary()


def greedy(engine, **prompt: object) -> str:  # type: ignore[no-untyped-def]
    params = SamplingParams(max_tokens=48)  # temperature 0: greedy
    spec = JobSpec(owner="t", model="onelane-demo", params=params, **prompt)  # type: ignore[arg-type]
    return "".join(chunk.text for chunk in generate(engine, spec))


def test_with_no_model_configured_the_shipped_demo_model_is_served() -> None:
    assert Settings.from_env({}).model_path == str(SHIPPED_DEMO_MODEL)
    assert (SHIPPED_DEMO_MODEL / "config.json").exists()


def test_the_shipped_demo_model_is_at_most_10_mb() -> None:
    assert sum(f.stat().st_size for f in SHIPPED_DEMO_MODEL.iterdir() if f.is_file()) <= MAX_BYTES


@pytest.mark.parametrize(
    "prompt",
    [
        {"prompt": "Hello!"},
        {"prompt": "The for statement"},
        {"messages": (Message(role="user", content="What is a dictionary?"),)},
    ],
)
def test_its_greedy_output_is_words_of_its_corpus(shipped, vocabulary, prompt) -> None:  # type: ignore[no-untyped-def]
    # Given the shipped model, when it answers a raw or a chat prompt greedily (as the web form asks by default)
    words = demo_corpus.words(greedy(shipped, **prompt))
    # then it writes a few dozen words, at least 80 % of them words of the text it learnt
    assert len(words) >= 20, words
    assert sum(w in vocabulary for w in words) >= 0.8 * len(words), words


def test_without_worker_demo_a_random_model_is_built_under_var(monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    from tasks import catalogue
    from worker.main import ensure_model

    monkeypatch.setattr(catalogue, "SHIPPED_DEMO_MODEL", tmp_path / "missing")
    settings = Settings(var_dir=tmp_path / "var")
    assert ensure_model(settings) == str((tmp_path / "var" / "demo-model").resolve())
    assert (tmp_path / "var" / "demo-model" / "config.json").exists()


def test_the_training_script_writes_a_model_mlx_lm_loads(tmp_path):  # type: ignore[no-untyped-def]
    from mlx_lm import load

    from worker.demo_build.train import VOCAB_SIZE, train_demo_model

    report = train_demo_model(tmp_path / "demo", steps=2, batch=1, compiled=False)
    tokenizer = load(str(tmp_path / "demo"))[1]
    assert report.steps == 2 and report.bytes_on_disk <= MAX_BYTES
    assert len(tokenizer.vocab) == VOCAB_SIZE and tokenizer.chat_template


def test_on_the_cpu_its_bfloat16_weights_run_as_float32(shipped) -> None:  # type: ignore[no-untyped-def]
    # Given the shipped model (stored as bfloat16, its config.json says), loaded with dtype "auto" on this CPU
    import mlx.core as mx

    # then its weights are float32 (MLX's CPU build has no BLAS under half-precision matmuls)
    assert shipped.model.model.layers[0].mlp.down_proj.weight.dtype == mx.float32


def test_a_model_too_big_for_a_quarter_of_memory_as_float32_stays_as_stored(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import mlx.core as mx
    from mlx_lm import load

    from worker.batch import dtypes

    # Given the bfloat16 demo model on a machine where, as float32, it would take just over a quarter of the memory
    model = load(str(SHIPPED_DEMO_MODEL))[0]
    monkeypatch.setattr(dtypes, "physical_memory", lambda: 4 * dtypes.float32_bytes(model) - 4)
    # When it is given dtype "auto", then its weights stay bfloat16
    assert dtypes.with_dtype(model, "auto") == "as stored"
    assert model.model.layers[0].mlp.down_proj.weight.dtype == mx.bfloat16
    # and with a quarter that holds them, they become float32
    monkeypatch.setattr(dtypes, "physical_memory", lambda: 4 * dtypes.float32_bytes(model))
    assert dtypes.with_dtype(model, "auto") == "float32"
    assert model.model.layers[0].mlp.down_proj.weight.dtype == mx.float32
