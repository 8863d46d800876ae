"""The models of 2026 against mlx_lm.server: tokens/s at 8 clients on a hybrid model and on Gemma 4 (issue 48).

    ./dev.sh bench new_archs [--archs qwen3_next,gemma4,jamba] [--rounds 3] [--clients 8] [--max-tokens 64]

No real checkpoint can be downloaded here, so each model is the tiny random-weight one of tests/tiny_archs.py (float32,
the demo tokenizer), written once into a temporary folder that both servers load. For each, bench/compare_servers.py
runs in its own process on that folder: `--workload ignore-eos` (every answer max_tokens long, non-streaming), the
given clients, the rounds alternating between the servers; then time to first token at 1 client. What this says is
the serving path's own cost around a small model (its batching, its queue, its HTTP): a tiny model's forward pass
takes a millisecond or two, so a server's per-token overhead shows in full. The per-architecture lines of
compare_servers' report are printed as they come, then a summary row per architecture with the ratio.

Every figure printed is measured in this run; every process started is stopped before the script returns.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ARCHS = "qwen3_next,gemma4,jamba"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default=ARCHS, help="architectures of tests/tiny_archs.py, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    from tests.tiny_archs import build

    rows = []
    with tempfile.TemporaryDirectory(prefix="onelane-bench-archs-") as tmp:
        for arch in args.archs.split(","):
            folder = build(arch, Path(tmp) / arch)
            print(f"\n=== {arch}: {folder} (load average {os.getloadavg()[0]:.2f})", flush=True)
            command = [
                sys.executable, "-m", "bench.compare_servers", "--model", str(folder), "--workload", "ignore-eos",
                "--levels", str(args.clients), "--rounds", str(args.rounds), "--max-tokens", str(args.max_tokens),
                "--requests", str(4 * args.clients), "--no-overload",
            ]  # fmt: skip
            run = subprocess.run(command, capture_output=True, text=True, timeout=3600)
            print(run.stdout[-6000:], flush=True)
            if run.returncode:
                print(run.stderr[-3000:], flush=True)
            rows.append((arch, run.stdout))
    print("\nsummary (the median over rounds of completion tokens/s at", args.clients, "clients):")
    for arch, out in rows:
        found = re.findall(r"^.*\b" + str(args.clients) + r"\b.*$", out, flags=re.M)
        print(f"  {arch}: " + (found[-1].strip() if found else "no figure (see its report above)"))


if __name__ == "__main__":
    main()
