"""Ollama's own GGUFs (issue 32): a file of each architecture mlx-lm serves that Ollama's users run most (llama,
mistral, qwen2, qwen3, gemma, gemma2, phi3), and of every quantized type of llama.cpp's (the K-quants of most of
Ollama's library among them), written here by the gguf package as llama.cpp's converter writes them, imported by
`onelane import-gguf`, answers with the logits mlx-lm gives for the same weights loaded directly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.utils import load_model

from tests.gguf_files import hf_config, hf_weights, write_arch_gguf
from worker.gguf import GgufError, import_gguf
from worker.gguf.header import TENSOR_TYPES

PROMPT = [1, 5, 9, 2, 7, 30, 3, 11, 4, 6]  # (positions past 0, where a rope on the wrong rows shows)


def reference(folder: Path, config: dict, weights: dict[str, np.ndarray]) -> mx.array:
    """The logits of mlx-lm's own model of `config` with `weights` (HF names, float32), loaded from a folder."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(folder / "model.safetensors"), {k: mx.array(v) for k, v in weights.items()})
    return logits(folder)


def logits(folder: Path) -> mx.array:
    """The logits of the model in `folder` for PROMPT, in float32."""
    model, _ = load_model(folder)
    model.set_dtype(mx.float32)
    return model(mx.array([PROMPT]))[0]


def imported(tmp_path: Path, arch: str, config: dict, types=None, dtype: str | None = None, extra=None):
    """Write a file of `arch`, import it, and give (its logits, mlx-lm's on the weights it holds, the folder)."""
    held = write_arch_gguf(tmp_path / f"{arch}.gguf", arch, config, hf_weights(arch, config), types, extra)
    folder = import_gguf(tmp_path / f"{arch}.gguf", tmp_path / "imported", dtype)
    return logits(folder), reference(tmp_path / "hf", config, held), folder


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3"])
def test_each_architecture_answers_as_mlx_lm_does_on_the_same_weights(arch, tmp_path):
    # Given a file of the architecture (F32, its embedding F16), When imported, Then its logits are mlx-lm's
    got, expected, folder = imported(
        tmp_path, arch, hf_config(arch), lambda name: "F16" * name.startswith("token") or "F32"
    )
    assert mx.abs(got - expected).max().item() < 1e-4 * mx.abs(expected).max().item(), mx.abs(got - expected).max()
    # and its tokenizer loads and reads text
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer.decode(tokenizer.encode("ab a", add_special_tokens=False)).strip() == "ab a"


@pytest.mark.parametrize("kind", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1"])
def test_a_requantized_type_is_stored_as_mlx_affine_weights_within_a_step_of_its_own(kind, tmp_path):
    # Given a llama file whose every matrix is `kind` (Q and K rows permuted, as llama.cpp writes them)
    config = hf_config("llama", hidden=256, ff=256, heads=4, kv_heads=2)
    got, expected, folder = imported(tmp_path, "llama", config, lambda name: kind)
    # When imported, Then each weight is MLX's affine weight of as many bits as the type holds (5 for the 5-bit types,
    # 6 for Q6_K, 4 for fewer), within a step of its group of the file's own value (MLX puts zero on each group's
    # grid, so its steps do not always straddle the value by halves)
    bits = {"Q3_K": 5, "Q5_0": 5, "Q5_1": 5, "Q5_K": 5, "Q6_K": 8}.get(kind, 4)
    assert json.loads((folder / "config.json").read_text())["quantization"]["bits"] == bits
    stored = mx.load(str(folder / "model.safetensors"))
    held = mx.load(str(tmp_path / "hf" / "model.safetensors"))
    for name, weight in held.items():
        stem = name.removesuffix(".weight")
        if f"{stem}.scales" in stored:
            scales, biases = stored[f"{stem}.scales"].astype(mx.float32), stored[f"{stem}.biases"].astype(mx.float32)
            values = mx.dequantize(stored[name], scales, biases, 32, bits)
            step = mx.repeat(mx.abs(scales), 32, axis=-1)
            rounding = 1e-3 * (mx.abs(weight) + mx.repeat(mx.abs(biases), 32, axis=-1)) + 1e-6  # (float16's)
            bound = step + rounding
            assert (mx.abs(values - weight) <= bound).all().item(), name
    # and its logits are mlx-lm's on the file's weights, but for that rounding
    error = (mx.abs(got - expected).max() / mx.abs(expected).max()).item()
    print(f"{kind}: logits within {error:.3f} of the largest")
    assert error < {4: 0.35, 5: 0.15, 8: 0.05}[bits], error


def test_a_file_of_every_type_dequantized_answers_exactly_and_stored_repacks_q4_and_q8_bit_for_bit(tmp_path):
    # Given a llama file whose matrices cover every type onelane imports
    config = hf_config("llama", hidden=256, ff=256, heads=4, kv_heads=2)
    kinds = [t[0] for t in TENSOR_TYPES.values()]
    parts = sorted(n for n in (f"blk.{i}.{p}.weight" for i in (0, 1) for p in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")))  # fmt: skip
    chosen = {name: kinds[i % len(kinds)] for i, name in enumerate(["token_embd.weight", "output.weight", *parts])}
    # When imported as float32, Then its logits are mlx-lm's on the weights the gguf package reads from it
    got, expected, _ = imported(tmp_path, "llama", config, chosen.get, dtype="float32")
    assert mx.abs(got - expected).max().item() < 1e-4 * mx.abs(expected).max().item()
    assert set(chosen.values()) == set(kinds)
    # and stored, the Q4_0, Q4_1 and Q8_0 matrices are the file's values exactly
    folder = import_gguf(tmp_path / "llama.gguf", tmp_path / "stored")
    stored, held = mx.load(str(folder / "model.safetensors")), mx.load(str(tmp_path / "hf" / "model.safetensors"))
    renamed = {"token_embd": "model.embed_tokens", "output": "lm_head"}
    for name, kind in chosen.items():
        if kind in ("Q4_0", "Q4_1", "Q8_0"):
            stem = renamed.get(name.removesuffix(".weight")) or _hf(name)
            scales, biases = (stored[f"{stem}.{kind}"].astype(mx.float32) for kind in ("scales", "biases"))
            w = mx.dequantize(stored[f"{stem}.weight"], scales, biases, 32, 8 if kind == "Q8_0" else 4)
            assert mx.array_equal(w, held[f"{stem}.weight"]), name


def _hf(name: str) -> str:
    parts = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}  # fmt: skip
    _, layer, part, _ = name.split(".")
    return f"model.layers.{layer}.{parts[part]}"


def llama3_divisors(base: float, dims: int, factor: float, low=1.0, high=4.0, context=8192) -> np.ndarray:
    """What llama.cpp's converter writes as rope_freqs for Llama 3's rope_scaling (convert_hf_to_gguf.py)."""
    wavelengths = 2 * np.pi * base ** (np.arange(0, dims, 2) / dims)
    smooth = (context / wavelengths - low) / (high - low)
    middle = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelengths < context / high, 1.0, np.where(wavelengths > context / low, factor, middle))


def test_llama_3s_rope_scaling_comes_back_from_its_rope_freqs(tmp_path):
    # Given a Llama 3.2 file: its rope_scaling written as the divisors of each rope frequency (factor 32)
    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip
    config = {**hf_config("llama", heads=2, kv_heads=1), "rope_theta": 500000.0, "rope_scaling": scaling}
    divisors = llama3_divisors(500000.0, 32, 32.0).astype(np.float32)
    assert 1 < len(set(divisors.tolist())) < 16  # (some frequencies scaled, some not, some in between)
    # When imported, Then config.json has the rope_scaling back, and the logits are mlx-lm's with it
    got, expected, folder = imported(tmp_path, "llama", config, extra={"rope_freqs.weight": divisors})
    assert json.loads((folder / "config.json").read_text())["rope_scaling"] == scaling
    assert mx.abs(got - expected).max().item() < 1e-4 * mx.abs(expected).max().item()
    # and divisors of another rope than Llama 3's are refused, not served with the wrong one
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(GgufError, match=r"its rope_freqs.weight is no Llama 3 rope scaling \(factor 32"):
        imported(
            other,
            "llama",
            config,
            extra={"rope_freqs.weight": llama3_divisors(500000.0, 32, 32.0, high=2.0).astype(np.float32)},
        )


def test_the_header_reader_knows_each_type_as_the_gguf_package_does():
    for kind, (name, block, size) in TENSOR_TYPES.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)] == (block, size) and gguf.GGMLQuantizationType(kind).name == name  # fmt: skip


def test_import_gguf_prints_no_pytorch_advice(tmp_path):
    config = hf_config("qwen2")
    write_arch_gguf(tmp_path / "q.gguf", "qwen2", config, hf_weights("qwen2", config))
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "import-gguf", str(tmp_path / "q.gguf"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "PyTorch" not in done.stdout + done.stderr, done.stderr
