"""Multi-turn chat, the workload chat clients make: every request resends the whole history. onelane with its
prefix cache vs onelane without it vs mlx_lm.server (which reuses its KV cache too), same machine, same run, same
model folder.

    ./dev.sh bench multiturn [--model PATH] [--users 1,4] [--turns 6] [--rounds 2] [--system-chars 6000]
                             [--answer-tokens 16] [--skip-uncached] [--skip-two-devices] [--skip-independent]

1. Conversations: each of U users (at once) holds a conversation of T turns that opens with the same long system
   message; every request streams (temperature 0, the answer kept to --answer-tokens: onelane `ignore_eos`,
   mlx_lm.server a logit bias against EOS) and carries the history so far. TTFT = time to the first content chunk.
   Each user has an API key of their own on onelane, so its cache entries are private (the default); mlx_lm.server
   has one cache for everyone. Every (round, server) starts its server afresh, cold; the order rotates each round.
2. After a restart: one conversation on onelane, then the active worker gets SIGTERM (a deploy), its supervisor's
   standby takes over, and the next turn is sent: its cached tokens say whether the entries survived.
3. Two devices: two workers on one Redis (two GPUs, as far as onelane can tell), the most users: the share of
   follow-up turns that read their history from the cache, with ONELANE_CACHE_AFFINITY_S=2 and with 0.
4. Nothing to hit: independent prompts (each one new, as no chat is) from 8 closed-loop clients, onelane with the
   cache on, then off, alternating rounds: tokens per second, and the ratio.

Every figure printed is measured in this run; every process started here is stopped before the script returns.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.chat_servers import QUESTIONS, Server, auth, baseline, onelane, system_message, two_devices
from bench.harness import START_S, at_once, poll_until, rotated
from bench.openai_load import Streamed, closed_loop, post_chat, stream_once
from bench.report import pct, spread
from tasks.catalogue import SHIPPED_DEMO_MODEL

TIMEOUT_S = 300.0
INDEPENDENT_CLIENTS = 8
INDEPENDENT_TOKENS = 64


def history_hits(run: Run) -> tuple[int, int]:
    """Follow-up turns that read more from the cache than the turn before them sent (their history, not only the
    system message), and all follow-up turns."""
    by_user: dict[int, list[Turn]] = {}
    for turn in run.turns:
        by_user.setdefault(turn.user, []).append(turn)
    pairs = [(a, b) for turns in by_user.values() for a, b in zip(turns, turns[1:])]
    return sum(b.cached_tokens > a.prompt_tokens for a, b in pairs), len(pairs)


def request(server: Server, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """A streamed greedy chat request, the same to both servers but for how EOS is kept out."""
    req: dict[str, Any] = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if server.eos is not None:
        req["logit_bias"] = {str(server.eos): -1e4}
    else:
        req["ignore_eos"], req["model"] = True, server.model
    return req


# --- 1. conversations ----------------------------------------------------------------------------------------------


@dataclass
class Turn:
    user: int
    n: int
    ttft: float | None
    prompt_tokens: int
    cached_tokens: int
    error: str | None


@dataclass
class Run:
    """One server's conversations at one number of users."""

    server: str
    users: int
    turns: list[Turn]
    wall_s: float

    def ttfts(self, first: bool) -> list[float]:
        return [t.ttft for t in self.turns if (t.n == 0) == first and t.ttft is not None]

    @property
    def errors(self) -> list[str]:
        return [t.error for t in self.turns if t.error]


def conversation(server: Server, user: int, system: str, turns: int, answer: int) -> list[Turn]:
    messages = [{"role": "system", "content": system}]
    done = []
    for n in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[n % len(QUESTIONS)]})
        got: Streamed = stream_once(server.url, request(server, messages, answer), TIMEOUT_S, auth(server, user))
        usage = got.usage or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        done.append(Turn(user, n, got.ttft, usage.get("prompt_tokens", 0), cached, got.error))
        if got.error:
            break
        messages.append({"role": "assistant", "content": got.text})
    return done


def conversations(server: Server, users: int, system: str, turns: int, answer: int) -> Run:
    """Every user's conversation at once."""
    started = time.monotonic()
    results = at_once(users, lambda u: conversation(server, u, system, turns, answer))
    return Run(server.name, users, [turn for user in results for turn in user], time.monotonic() - started)


# --- 2. across a restart -------------------------------------------------------------------------------------------


def restart_check(model: str, system: str, answer: int, log: Path) -> tuple[Turn, Turn, float]:
    """Two turns, SIGTERM to the active worker, the third turn: (the turn before, the turn after, seconds the
    handover took until /readyz answered again)."""
    with onelane(model, 1, True, log) as server:
        before = conversation(server, 0, system, 2, answer)
        assert server.store is not None
        pid = next(w.pid for w in server.store.readings.snapshot().workers)
        os.kill(pid, signal.SIGTERM)
        stopped = time.monotonic()
        if not poll_until(
            lambda: any(w.pid != pid and w.models for w in server.store.readings.snapshot().workers), START_S
        ):
            raise RuntimeError("no worker took over after the restart")
        handover = time.monotonic() - stopped
        after = conversation(server, 0, system, 3, answer)[-1]
    return before[-1], after, handover


# --- 3. nothing to hit ---------------------------------------------------------------------------------------------


def independent(server: Server, rounds_seed: int) -> float:
    """Tokens per second from closed-loop clients whose every prompt is new."""
    counter = iter(range(rounds_seed * 100_000, (rounds_seed + 1) * 100_000))
    lock = threading.Lock()

    def one(prompt: str) -> Any:
        with lock:
            n = next(counter)
        req = {
            "messages": [{"role": "user", "content": f"{n} {prompt}"}],
            "max_tokens": INDEPENDENT_TOKENS,
            "temperature": 0.0,
            "ignore_eos": True,
            "model": server.model,
        }
        return post_chat(server.url, req, TIMEOUT_S, headers=auth(server, 0))

    level = closed_loop(INDEPENDENT_CLIENTS, one)
    tokens = sum(o.completion_tokens for o in level.ok)
    return tokens / level.wall_s


# --- report --------------------------------------------------------------------------------------------------------


def p50(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:,.0f} ms"


def report(runs: list[Run], users_levels: list[int]) -> None:
    print("\nconversations (medians over the rounds; each round's p50 first):")
    names = list(dict.fromkeys(r.server for r in runs))
    header = (
        f"{'users':>5}  {'server':<18} {'first-turn TTFT p50':>20} {'follow-up TTFT p50':>20} "
        f"{'follow-up p95':>14} {'wall':>8} {'cached share':>12}"
    )
    print(header)
    summary: dict[tuple[int, str], dict[str, float | None]] = {}
    for users in users_levels:
        for name in names:
            mine = [r for r in runs if r.server == name and r.users == users]
            summary[(users, name)] = report_row(users, name, mine)
    print("\nratios (onelane / the other; below 1.0: onelane is faster):")
    for users in users_levels:
        ol = summary.get((users, "onelane"))
        for other in ("mlx_lm.server", "onelane, no cache"):
            o = summary.get((users, other))
            if not ol or not o:
                continue
            parts = [f"{key} {ol[key] / o[key]:.2f}x" for key in ("first", "follow", "wall") if ol[key] and o[key]]
            print(f"  {users} user(s), vs {other}: " + ", ".join(parts))
        if ol and ol["first"] and ol["follow"]:
            print(
                f"  {users} user(s), onelane's follow-up turn is {ol['first'] / ol['follow']:.1f}x faster to its first "
                "token than its first turn"
            )


def report_row(users: int, name: str, mine: list[Run]) -> dict[str, float | None]:
    """One server's row at one number of users, and its rounds under it; returns the row's medians."""
    first = [p50(r.ttfts(True)) for r in mine]
    follow = [p50(r.ttfts(False)) for r in mine]
    p95 = [pct(r.ttfts(False), 95) for r in mine if r.ttfts(False)]
    walls = [r.wall_s for r in mine]
    follow_turns = [t for r in mine for t in r.turns if t.n > 0]
    share = sum(t.cached_tokens for t in follow_turns) / max(1, sum(t.prompt_tokens for t in follow_turns))
    row = {
        "first": p50([x for x in first if x is not None]),
        "follow": p50([x for x in follow if x is not None]),
        "wall": p50(walls),
    }
    errors = [e for r in mine for e in r.errors]
    print(
        f"{users:>5}  {name:<18} {ms(row['first']):>20} {ms(row['follow']):>20} "
        f"{ms(p50(p95)):>14} {row['wall']:>7.1f}s {share:>11.0%}" + (f"   errors: {errors[:3]}" if errors else "")
    )

    def rounds(values: list[Any], fmt: str) -> str:
        kept = [v for v in values if v is not None]
        return spread(kept, fmt, True) if kept else "–"

    print(
        f"{'':>5}  {'':<18} {'rounds: ' + rounds(first, '{:.3f}'):>20} {rounds(follow, '{:.3f}'):>20} "
        f"{'':>14} {rounds(walls, '{:.1f}'):>8}"
    )
    return row


def main() -> None:
    args = parse_args()
    users_levels = [int(u) for u in args.users.split(",")]
    system = system_message(args.system_chars)
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"onelane-multiturn-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    print(
        f"model {args.model}; system message {len(system)} characters; {args.turns} turns of {args.answer_tokens}-token "
        f"answers; users {users_levels}; {args.rounds} round(s); logs in {logs}"
    )
    report(conversation_rounds(args, users_levels, system, logs), users_levels)
    after_restart(args, system, logs)
    if not args.skip_two_devices:
        steering(args, max(users_levels), system, logs)
    if not args.skip_independent:
        nothing_to_hit(args, logs)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(SHIPPED_DEMO_MODEL), help="a model folder both servers load")
    parser.add_argument("--users", default="1,4")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--system-chars", type=int, default=6000)
    parser.add_argument("--answer-tokens", type=int, default=16)
    parser.add_argument("--skip-uncached", action="store_true", help="leave out onelane without its cache")
    parser.add_argument("--skip-independent", action="store_true")
    parser.add_argument("--skip-two-devices", action="store_true")
    return parser.parse_args()


def conversation_rounds(args: argparse.Namespace, users_levels: list[int], system: str, logs: Path) -> list[Run]:
    """1. Every round, every number of users, on each server afresh, the order rotating each round."""
    variants = [
        ("onelane", lambda users, log: onelane(args.model, users, True, log)),
        ("mlx_lm.server", lambda users, log: baseline(args.model, log)),
    ]
    if not args.skip_uncached:
        variants.append(("onelane, no cache", lambda users, log: onelane(args.model, users, False, log)))
    runs: list[Run] = []
    for rnd in range(args.rounds):
        for users in users_levels:
            for name, start in rotated(variants, rnd):
                with start(users, logs / f"r{rnd}-u{users}-{name.replace(' ', '').replace(',', '')}") as server:
                    run = conversations(server, users, system, args.turns, args.answer_tokens)
                runs.append(run)
                print(
                    f"  round {rnd + 1}, {users} user(s), {name}: wall {run.wall_s:.1f} s, follow-up TTFT p50 "
                    f"{ms(p50(run.ttfts(False)))}, first {ms(p50(run.ttfts(True)))}"
                    + (f", errors {run.errors[:2]}" if run.errors else ""),
                    flush=True,
                )
    return runs


def after_restart(args: argparse.Namespace, system: str, logs: Path) -> None:
    """2. Whether the cache's entries survive a restart in good order."""
    before, after, handover = restart_check(args.model, system, args.answer_tokens, logs / "restart")
    print(
        f"\nafter a restart in good order (SIGTERM to the active worker; the standby answered after {handover:.1f} s):"
        f" the next turn read {after.cached_tokens} of its {after.prompt_tokens} prompt tokens from the cache "
        f"(TTFT {ms(after.ttft)}; the turn before the restart: {before.cached_tokens} of {before.prompt_tokens}, "
        f"TTFT {ms(before.ttft)})"
    )


def steering(args: argparse.Namespace, users: int, system: str, logs: Path) -> None:
    """3. On two devices, with cache affinity and without: how many follow-ups find their history."""
    print(f"\ntwo devices, {users} users: does a follow-up go where its history is?")
    for affinity_s in (2.0, 0.0) * args.rounds:
        with two_devices(args.model, users, affinity_s, logs / f"two-{affinity_s:g}") as server:
            run = conversations(server, users, system, args.turns, args.answer_tokens)
        hit, of = history_hits(run)
        print(
            f"  {server.name}: {hit} of {of} follow-ups read their history from the cache ({hit / of:.0%}); "
            f"follow-up TTFT p50 {ms(p50(run.ttfts(False)))}, wall {run.wall_s:.1f} s"
            + (f", errors {run.errors[:2]}" if run.errors else ""),
            flush=True,
        )


def nothing_to_hit(args: argparse.Namespace, logs: Path) -> None:
    """4. Independent prompts, the cache on and off in alternating rounds: what the cache costs when it cannot help."""
    rates: dict[bool, list[float]] = {True: [], False: []}
    for rnd in range(args.rounds * 2):
        cache = rnd % 2 == 0
        with onelane(args.model, 1, cache, logs / f"independent-{rnd}") as server:
            rates[cache].append(independent(server, rnd))
        print(
            f"  nothing to hit, round {rnd + 1}, cache {'on' if cache else 'off'}: {rates[cache][-1]:.1f} tok/s",
            flush=True,
        )
    on, off = p50(rates[True]), p50(rates[False])
    print(
        f"\nnothing to hit ({INDEPENDENT_CLIENTS} clients, every prompt new, {INDEPENDENT_TOKENS} tokens each): "
        f"cache on {on:.1f} tok/s ({spread(rates[True], '{:.1f}', True)}), off {off:.1f} tok/s "
        f"({spread(rates[False], '{:.1f}', True)}): {on / off:.3f}x"
    )


if __name__ == "__main__":
    main()
