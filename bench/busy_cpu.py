"""A prompt read on a machine that other processes keep busy: the worker's BLAS shim sending every product to its own
kernel (as shipped) against sending only products of up to 64 rows there and a prompt's chunks to OpenBLAS's sgemm
(the shim before 2026-12-06), same run, quiet and beside busy processes.

    ./dev.sh bench busy_cpu [--model smollm2|demo|PATH] [--rounds 3] [--repeat 2] [--prompt-tokens 512]
                            [--max-tokens 32] [--busy 0,2]

For each count of busy processes (bench/harness.py cpu_hogs, started here and stopped after), --rounds rounds; each
round starts a fresh process per configuration, the order rotating round by round. Each process loads the model as the
worker does (worker/blas: OpenBLAS and the shim preloaded; the engine with the worker's default prefill step, so a
prompt is read in chunks of that many rows), answers a short warm-up, then --repeat chat jobs of a prompt of about
--prompt-tokens tokens (each different, greedy, ignore_eos, --max-tokens tokens), one at a time, as one job alone on
the worker does (bench/harness.generate). Printed per busy count and configuration: the time to the first token
(the prompt read) and decode tokens/s, median (min-max) over every job of every round, and the ratio of the medians,
before over after.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import add_model_option, cpu_hogs, model_folder
from bench.report import median, spread
from tasks.settings import Settings
from worker.blas import SHIM_PREFIX, openblas_path, worker_env

CONFIGS = {"before": 64, "after": None}  # the most rows a product may have to go to the shim's kernel (None: as built)
TOPICS = ("the harbour", "a mountain pass", "the old mill", "a night train", "the glasshouse", "a river ferry")


def document(topic: str, words: int) -> str:
    """A made-up report about `topic`, about `words` words long."""
    line = f"The survey of {topic} counted {{n}} visitors, {{m}} of them on foot, and noted the weather each day."
    return "\n".join(line.format(n=i * 37 % 1000, m=i * 11 % 300) for i in range(words // 18 + 1))


def probe(model: str, rows: int | None, prompt_tokens: int, max_tokens: int, repeat: int) -> dict[str, object]:
    """Measure in this process (run as a child, its environment the worker's)."""
    from bench.harness import generate
    from tasks.job import JobSpec, Message, SamplingParams
    from worker.batch.engine import Engine

    shims = [p for p in os.environ.get("LD_PRELOAD", "").split() if Path(p).name.startswith(SHIM_PREFIX)]
    if not shims:
        sys.exit("the shim is not preloaded (no C compiler, or ONELANE_OPENBLAS=false): nothing to compare")
    if rows is not None:
        ctypes.c_int.in_dll(ctypes.CDLL(shims[0]), "onelane_gemv_max_rows").value = rows
    engine = Engine.load(model, 1, Settings().prefill_step)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)

    def job(text: str, tokens: int) -> JobSpec:
        return JobSpec(
            owner="b",
            model="m",
            messages=[Message(role="user", content=text)],
            params=params.model_copy(update={"max_tokens": tokens}),
        )

    list(generate(engine, job("Say hi.", 2)))
    ttft, decode, prompts, texts = [], [], [], []
    for topic in TOPICS[:repeat]:
        spec = job(f"Summarise this report in one line.\n{document(topic, int(prompt_tokens * 0.7))}", max_tokens)
        prompts.append(len(engine.prompt_tokens(spec)))
        started = time.perf_counter()
        chunks = generate(engine, spec)
        text = [next(chunks).text]
        first = time.perf_counter()
        text += [c.text for c in chunks]
        ttft.append(first - started)
        decode.append((max_tokens - 1) / (time.perf_counter() - first))
        texts.append("".join(text))
    return {"ttft_s": ttft, "decode_tok_s": decode, "prompt_tokens": prompts, "texts": texts}


def run_child(model: str, rows: int | None, args: argparse.Namespace) -> dict[str, object]:
    command = [sys.executable, "-m", "bench.busy_cpu", "--child", model, "--prompt-tokens", str(args.prompt_tokens)]
    command += ["--max-tokens", str(args.max_tokens), "--repeat", str(args.repeat)]
    command += [] if rows is None else ["--rows", str(rows)]
    env = worker_env({k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        sys.exit(f"a measuring process failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser()
    add_model_option(parser)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per busy count, the order rotating")
    parser.add_argument("--repeat", type=int, default=2, help="jobs per process (at most 6)")
    parser.add_argument("--prompt-tokens", type=int, default=512, help="each job's prompt, about")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--busy", default="0,2", help="counts of busy processes, comma-separated")
    parser.add_argument("--child")
    parser.add_argument("--rows", type=int)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(probe(args.child, args.rows, args.prompt_tokens, args.max_tokens, min(args.repeat, 6))))
        return
    if openblas_path() is None:
        sys.exit("OpenBLAS not found: ./dev.sh bench installs it")
    with tempfile.TemporaryDirectory() as tmp:
        model = str(model_folder(args.model, Path(tmp)))
        print(f"model {args.model}, prefill step {Settings().prefill_step}, {os.cpu_count()} cores", flush=True)
        for count in (int(c) for c in args.busy.split(",")):
            got: dict[str, list[dict[str, object]]] = {name: [] for name in CONFIGS}
            with cpu_hogs(count):
                for r in range(args.rounds):
                    names = list(CONFIGS)[r % 2 :] + list(CONFIGS)[: r % 2]
                    for name in names:
                        got[name].append(run_child(model, CONFIGS[name], args))
                        print(f"  busy {count}, round {r + 1}, {name}: {got[name][-1]['ttft_s']}", flush=True)
            report(count, got)


def report(count: int, got: dict[str, list[dict[str, object]]]) -> None:
    def all_of(name: str, key: str) -> list[float]:
        return [v for child in got[name] for v in child[key]]  # type: ignore[attr-defined]

    prompts = sorted(set(all_of("after", "prompt_tokens")))
    same = all(a["texts"] == b["texts"] for a, b in zip(got["before"], got["after"]))
    print(f"busy processes {count}, prompts {prompts} tokens, same greedy texts before and after: {same}")
    for key, unit, fmt in (("ttft_s", "s", "{:.2f}"), ("decode_tok_s", "tok/s", "{:.1f}")):
        before, after = all_of("before", key), all_of("after", key)
        ratio = median(before) / median(after) if key == "ttft_s" else median(after) / median(before)
        print(f"  {key:13s} before {spread(before, fmt)} {unit}; after {spread(after, fmt)} {unit}; x{ratio:.2f}")


if __name__ == "__main__":
    main()
