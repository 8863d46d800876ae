"""Baseline: mlx_lm.server (ships with mlx-lm) serving the demo model, driven through /v1/chat/completions.

Closed-loop clients at 1, 8 and 32 at once (non-streaming), then an overload probe: 64 clients at once
asking for 1000 tokens each with a 3 s client timeout, watching what the server does after they give up.
EOS is pushed down with logit_bias (mlx_lm.server has no ignore_eos), so every answer is max_tokens long;
the completion token counts actually returned are printed.
Run: .venv/bin/python -m bench.mlx_server_baseline [--size tiny|small] [--allow-eos]
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from bench.harness import bench_env
from bench.mlx_server import Server, load_level, mlx_level_lines, mlx_server, overload_lines, overload_probe, settle
from bench.openai_load import LEVELS, MAX_TOKENS, SETTLE_S, Level


def measure(server: Server, levels: list[int], max_tokens: int, overload: bool) -> tuple[list[Level], list[int], Any]:
    """Each level in turn, each followed by waiting out its leftovers; then the overload probe.

    Returns the levels, the clients of those whose leftovers outlived SETTLE_S, and the probe (or None)."""
    done: list[Level] = []
    unsettled: list[int] = []
    for clients in levels:
        done.append(load_level(server, clients, max_tokens))
        if not settle(server):
            unsettled.append(clients)
    return done, unsettled, overload_probe(server) if overload else None


def main() -> None:
    """Run every level and the overload probe against a fresh demo model and print the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrent clients, comma-separated")
    parser.add_argument("--allow-eos", action="store_true", help="no logit bias against EOS: answers may end early")
    parser.add_argument("--no-overload", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()[0]

    with (
        bench_env(args.size) as settings,
        mlx_server(settings.model_path, settings.var_dir / "server.log", args.allow_eos) as server,
    ):
        levels, unsettled, probe = measure(
            server, [int(c) for c in args.levels.split(",")], args.max_tokens, not args.no_overload
        )

    eos_note = "EOS allowed" if args.allow_eos else "EOS suppressed by logit_bias"
    print(
        f"mlx_lm.server, demo model {args.size}, max_tokens {args.max_tokens}, temperature 0, {eos_note}, "
        f"non-streaming; load average {load:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    for level in levels:
        print("\n".join(mlx_level_lines(level)))
        if level.clients in unsettled:
            print(f"mlx_lm.server c={level.clients}: WARNING: still generating {SETTLE_S:.0f} s after the level ended")
    if probe is not None:
        print("\n".join(overload_lines(probe)))


if __name__ == "__main__":
    main()
