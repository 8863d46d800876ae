"""A prompt past its model's context (issue 60, item 4): how long 32,000 emoji (96,030 tokens for SmolLM2's
tokenizer, 12x its 8,192-token context; 128,000 for the demo model's) take to be refused, and how long another
user's short question waits meanwhile, this checkout against a baseline revision (the main this fix began from),
same run, same machine.

    ./dev.sh bench context_refusal [--model smollm2|demo|PATH] [--rounds 3] [--baseline 59e5741]
                                   [--time-limit 60] [--timeout 300]

The baseline's code is `git archive`d into a temporary folder and its processes run from it (PYTHONSAFEPATH and
PYTHONPATH: its `tasks`, `web`, `worker` and `cli`, this checkout's virtualenv). Each system gets a fresh server
(Redis, `onelane worker`, `onelane web`, ONELANE_JOB_TIME_LIMIT=--time-limit so that the baseline's long job ends);
after a warm-up question, each round: user A sends the long prompt (chat completions, not streamed, max_tokens 16);
0.5 s later user B sends a short question (max_tokens 5). Printed per system and round: A's status and time to its
answer, B's status and time to its answer; then per figure the median (min-max) over the rounds, and the ratio of the
baseline's medians to this checkout's. Every process started is stopped before it returns.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench.harness import add_model_option, bench_env, onelane_stack
from bench.report import median, spread

LONG = "\U0001f600" * 32_000
KEYS = {"a": "sk-bench-user-a", "b": "sk-bench-user-b"}  # two users: A's long prompt, B's question
ROOT = Path(__file__).resolve().parents[1]


def post(url: str, body: dict[str, Any], key: str, timeout_s: float) -> tuple[int, float, str]:
    """The answer's status, the seconds it took, and its body's first 160 characters."""
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEYS[key]}"},
    )
    began = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            status, text = answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode()
    except (TimeoutError, urllib.error.URLError) as exc:
        status, text = 0, str(exc)
    return status, time.monotonic() - began, text[:160]


def round_(url: str, model: str, timeout_s: float) -> dict[str, Any]:
    """One round: A's long prompt, B's question half a second later."""
    ask = {"model": model, "temperature": 0}
    out: dict[str, Any] = {}

    def long() -> None:
        out["a"] = post(url, {**ask, "messages": [{"role": "user", "content": LONG}], "max_tokens": 16}, "a", timeout_s)

    thread = threading.Thread(target=long)
    thread.start()
    time.sleep(0.5)
    out["b"] = post(url, {**ask, "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 5}, "b", timeout_s)
    thread.join()
    return out


def system(label: str, tree: Path | None, args: argparse.Namespace) -> list[dict[str, Any]]:
    """--rounds rounds on a fresh server running `tree`'s code (None: this checkout's)."""
    code = {"PYTHONSAFEPATH": "1", "PYTHONPATH": str(tree)} if tree else {}
    with (
        bench_env(model=args.model) as settings,
        onelane_stack(
            settings,
            quiet=True,
            ONELANE_JOB_TIME_LIMIT=str(args.time_limit),
            ONELANE_API_KEYS=f"a:{KEYS['a']},b:{KEYS['b']}",
            **code,
        ) as stack,
    ):
        model = settings.model_name
        post(stack.url, {"model": model, "messages": [{"role": "user", "content": "warm"}], "max_tokens": 2}, "b", 120)
        rounds = []
        for n in range(args.rounds):
            r = round_(stack.url, model, args.timeout)
            (a_status, a_s, a_text), (b_status, b_s, _) = r["a"], r["b"]
            print(f"  {label} round {n + 1}: A {a_status} in {a_s:.2f} s, B {b_status} in {b_s:.2f} s   A: {a_text!r}")
            rounds.append(r)
        return rounds


def baseline_tree(revision: str, folder: Path) -> Path:
    """The code of `revision`, as `git archive` gives it, in `folder`."""
    archive = subprocess.run(["git", "archive", revision], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_option(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", default="59e5741", help="the git revision compared against")
    parser.add_argument("--time-limit", type=float, default=60.0, help="ONELANE_JOB_TIME_LIMIT of both servers")
    parser.add_argument("--timeout", type=float, default=300.0, help="a request's own bound, seconds")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="onelane-baseline-") as tmp:
        base = baseline_tree(args.baseline, Path(tmp))
        results = {"this": system("this", None, args), args.baseline: system(args.baseline, base, args)}
    print(f"\n{args.rounds} rounds each, model {args.model}; median (min-max) seconds")
    medians: dict[str, tuple[float, float]] = {}
    for label, rounds in results.items():
        a, b = [r["a"][1] for r in rounds], [r["b"][1] for r in rounds]
        statuses = sorted({r["a"][0] for r in rounds}), sorted({r["b"][0] for r in rounds})
        medians[label] = (median(a), median(b))
        print(
            f"  {label:>8}: A (the long prompt) answered {statuses[0]} in {spread(a, '{:.2f}', short=True)} s; "
            f"B (short) answered {statuses[1]} in {spread(b, '{:.2f}', short=True)} s"
        )
    (a_now, b_now), (a_before, b_before) = medians["this"], medians[args.baseline]
    print(f"  ratio {args.baseline} / this: A's answer {a_before / a_now:.0f}x, B's wait {b_before / b_now:.0f}x")


if __name__ == "__main__":
    main()
