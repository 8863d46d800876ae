"""Image work beside a stream (issue 60, item 3): how long another user's stream waits for a token while a chat about
32 images, their count_tokens, or a follow-up about them is prepared, this tree against another.

    ./dev.sh bench vision_prep --baseline TREE [--rounds 3]

The workload is tests/test_vision_prep.py's three floor stories (the tiny Gemma 3 with a 448x448 tower, 32 noisy
JPEGs of 896x896 a request, three tries each), run by pytest in each source tree in turn (this one's story file is
copied into the other, its follow-up's count of the image preparer's calls left out there: the tree before has no
preparer). Per story and tree: the stream's worst gap while the work ran less its worst gap in a window as long
right after (the machine's own noise), each try; printed per round, then the median and range over every try, and
the ratio this tree / the other. The worker and the web run in pytest's process, as in the stories.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORY = ROOT / "tests" / "test_vision_prep.py"
KINDS = ("chat", "count_tokens", "follow-up")
LINE = re.compile(r"^(chat|count_tokens|follow-up) stalls (\[.*\])", re.M)


def run(tree: Path) -> dict[str, list[float]]:
    """One pass of the floor stories in `tree`: each story's stalls (s)."""
    with tempfile.TemporaryDirectory() as folder:
        story = Path(folder) / "test_vision_prep_bench.py"
        text = STORY.read_text()
        if tree != ROOT:  # (the tree before has no image preparer to count)
            text = text.replace("(engine().prep.asked, engine().images_read)", "(0, engine().images_read)")
        story.write_text(text)
        target = tree / "tests" / story.name
        shutil.copy(story, target)
        try:
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-n",
                    "0",
                    "-q",
                    "-s",
                    "-p",
                    "no:cacheprovider",
                    "-k",
                    "floor",
                    str(target),
                ],  # fmt: skip
                cwd=tree,
                capture_output=True,
                text=True,
                timeout=1800,
                env={**os.environ, "PYTHONPATH": str(tree)},
            ).stdout
        finally:
            target.unlink(missing_ok=True)
    found = {kind: [float(x) for x in ast.literal_eval(stalls)] for kind, stalls in LINE.findall(out)}
    missing = [k for k in KINDS if k not in found]
    if missing:
        print(f"  {tree}: no figures for {missing}:\n{out[-2000:]}")
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the source tree to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    trees = {"this": ROOT, "baseline": args.baseline.resolve()}
    stalls: dict[str, dict[str, list[float]]] = {name: {k: [] for k in KINDS} for name in trees}
    print(f"load average {os.getloadavg()}")
    for r in range(args.rounds):
        for name in sorted(trees, key=lambda n: (n == "this") == (r % 2 == 0)):  # (order rotated each round)
            for kind, values in run(trees[name]).items():
                stalls[name][kind] += values
                print(f"round {r + 1} {name:8} {kind:12} " + " ".join(f"{v * 1000:7.0f} ms" for v in values))
    print(f"\nload average {os.getloadavg()}\nworst gap beside the work, less the noise's: median (range) over tries")
    for kind in KINDS:
        figures = {n: stalls[n][kind] for n in trees}
        if not all(figures.values()):
            continue
        this, base = (statistics.median(figures[n]) for n in ("this", "baseline"))
        ranges = {n: f"{min(v) * 1000:.0f}..{max(v) * 1000:.0f}" for n, v in figures.items()}
        ratio = this / base if base > 0 else float("nan")
        print(
            f"{kind:12} this {this * 1000:7.0f} ms ({ranges['this']})   baseline {base * 1000:7.0f} ms "
            f"({ranges['baseline']})   ratio {ratio:.2f}"
        )


if __name__ == "__main__":
    main()
