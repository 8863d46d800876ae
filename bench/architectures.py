"""Which of mlx-lm's architectures onelane serves right: a tiny random-weight model of each (tests/tiny_archs.py),
served by the real worker (in this process, from one catalog), three prompts of different lengths at once, greedy,
12 tokens past EOS, each answer compared with mlx-lm's own greedy answer to that prompt alone.

    ./dev.sh bench architectures [--chunk N] [ARCH ...]

Prints one row per architecture: its cache types (the classes of make_prompt_cache), what onelane did with its jobs
(batched: they ran together; alone: one after another; refused: none ran), and whether every answer was mlx-lm's
(else where it departed); then the architectures skipped, and why. It writes nothing else (its models, Redis and
worker live in a temporary folder). tests/test_architectures.py asserts the same, one test per architecture.
With `--chunk N`, every model reads prompts N tokens a step, as worker/batch/chunking.py has a model do whose longer
reads cost more (or any model timed on a busy machine: 2 was seen), its batching trial tried at that chunk too.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from bench.harness import private_redis
from tasks.settings import Settings
from worker.blas import preload_openblas

STALL_S = 20.0  # (as the test's: a first run may spend seconds compiling its kernels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archs", nargs="*", help="architectures to run (default: every one that builds)")
    parser.add_argument("--chunk", type=int, default=0, help="prompt tokens every model reads a step (default: timed)")
    args = parser.parse_args()
    preload_openblas()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # (its warnings about tiny configs are not ours)
    logging.basicConfig(level=logging.CRITICAL)  # the worker's log of failed steps would bury the table
    from tests.tiny_archs import MAX_TOKENS, PROMPTS, SKIPPED, Sweep, architectures, build_all

    archs = args.archs or architectures()
    if args.chunk:  # (in place of the timing worker/models.py does as a model loads)
        import worker.models
        from worker.batch.chunking import Chunking

        worker.models.choose_chunk = lambda model, step, vocab: Chunking(args.chunk, ())  # type: ignore[assignment]
    started = time.perf_counter()
    with private_redis() as (folder, url):
        folders = build_all(folder / "models", archs)
        settings = Settings(redis_url=url, var_dir=folder, max_batch=4, lease_s=6)
        sweep = Sweep(settings, folders, STALL_S).start()
        words = " / ".join(str(len(p.split())) for p in PROMPTS)
        read = f"{args.chunk} token(s) a step" if args.chunk else "in timed chunks"
        print(f"{len(archs)} architectures; prompts of {words} words at once, read {read}, greedy, {MAX_TOKENS} tokens")
        print(f"{'architecture':<22}{'cache types':<38}{'onelane':<9}equal to mlx-lm alone")
        modes: dict[str, int] = {}
        equal = 0
        try:
            for arch in archs:
                row = sweep.run(arch)
                modes[row.mode] = modes.get(row.mode, 0) + 1
                equal += row.equal
                verdict = "yes" if row.equal else f"no: {row.failure()}"
                print(f"{arch:<22}{', '.join(row.caches):<38}{row.mode:<9}{verdict}", flush=True)
        finally:
            sweep.stop()
    counts = ", ".join(f"{n} {mode}" for mode, n in sorted(modes.items()))
    print(f"{equal} of {len(archs)} equal; {counts}; {time.perf_counter() - started:.0f} s")
    for arch, why in sorted(SKIPPED.items()):
        print(f"skipped {arch}: {why}")


if __name__ == "__main__":
    main()
