"""CPU BLAS: MLX's Linux CPU build bundles a reference BLAS; does preloading OpenBLAS speed up generation?

Runs the same measurements in two fresh processes, without and with LD_PRELOAD of Debian's
libopenblas0-pthread: a 1024x1024 fp32 matmul, and generation on the demo model (`--size small`, ~25 M
parameters): prompt processing and decode tokens/s, with the generated tokens compared for equality.
Run: ./dev.sh bench blas [--size small] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from worker.blas import openblas_path


def probe(model: str, tokens: int) -> dict[str, object]:
    """Measure in this process (run as a child)."""
    import mlx.core as mx

    from bench.harness import generate
    from tasks.job import JobSpec, SamplingParams
    from worker.batch.engine import Engine

    a = mx.random.normal((1024, 1024))
    mx.eval(a @ a)
    started = time.perf_counter()
    for _ in range(5):
        mx.eval(a @ a)
    matmul_ms = (time.perf_counter() - started) / 5 * 1000
    engine = Engine.load(model)
    spec = JobSpec(
        owner="b",
        model="m",
        prompt="The queue keeps the GPU busy. " * 16,
        params=SamplingParams(max_tokens=tokens, ignore_eos=True),
    )
    list(generate(engine, spec.model_copy(update={"params": SamplingParams(max_tokens=2, ignore_eos=True)})))
    started = time.perf_counter()
    chunks = generate(engine, spec)
    first = next(chunks)
    prefill_s = time.perf_counter() - started
    text = [first.text]
    decode_started = time.perf_counter()
    for chunk in chunks:
        text.append(chunk.text)
    decode_s = time.perf_counter() - decode_started
    return {
        "matmul_ms": matmul_ms,
        "prefill_s": prefill_s,
        "prompt_tokens": len(engine.prompt_tokens(spec)),
        "decode_tok_s": (tokens - 1) / decode_s,
        "text": "".join(text),
    }


def run_child(model: str, tokens: int, preload: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload:
        env["LD_PRELOAD"] = preload
    out = subprocess.run(
        [sys.executable, "-m", "bench.blas", "--child", model, "--tokens", str(tokens)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="small", choices=["tiny", "small"])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(probe(args.child, args.tokens)))
        return
    library = openblas_path()
    if library is None:
        sys.exit("OpenBLAS not found: apt-get install libopenblas0-pthread")
    from worker.demo_build.model import make_demo_model

    with tempfile.TemporaryDirectory() as tmp:
        model = str(make_demo_model(Path(tmp) / "model", size=args.size))
        bundled = run_child(model, args.tokens, None)
        openblas = run_child(model, args.tokens, library)
    print(
        f"demo model {args.size}, prompt {bundled['prompt_tokens']} tokens, {args.tokens} generated, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    for name, key, unit in [
        ("1024x1024 fp32 matmul", "matmul_ms", "ms"),
        ("prompt processing", "prefill_s", "s"),
        ("decode", "decode_tok_s", "tok/s"),
    ]:
        b, o = float(bundled[key]), float(openblas[key])  # type: ignore[arg-type]
        ratio = b / o if unit != "tok/s" else o / b
        print(f"{name:22s} bundled BLAS {b:10.2f} {unit:5s} OpenBLAS {o:10.2f} {unit:5s} -> x{ratio:.1f} faster")
    print(f"same generated text: {bundled['text'] == openblas['text']}")
    print(f"OpenBLAS: {library}")


if __name__ == "__main__":
    main()
