"""A session after a crash: the follow-up turn's time to first token once the server was killed (SIGKILL) and
started again, with the conversation's history resent. onelane reading that history from its prefix cache's disk
tier, vs onelane without it (ONELANE_PREFIX_CACHE_DISK=0: the history is prefilled again), vs mlx_lm.server killed
and restarted (it has no disk tier), same machine, same run, same model folder.

    ./dev.sh bench restart_cache [--model smollm2|demo|PATH] [--history 2000,6000] [--rounds 3] [--answer-tokens 16]

For each history size and round, each server is started afresh (the order rotating each round): a first turn
carries a system message of about that many tokens and a question; once it is answered (and, on onelane, its entry
is on disk) the server is SIGKILLed; onelane's supervisor starts a new worker, mlx_lm.server is started again; the
follow-up turn (the history, the answer, a new question) is then streamed, greedy. TTFT = time to its first content
chunk, measured from the request, after the server answers again. Printed: TTFT medians with min–max over rounds,
the prompt's tokens and those read from cache, and the ratios against mlx_lm.server and against onelane without
its disk tier. Every figure is measured in this run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.chat_servers import QUESTIONS, Server, auth, serving, stack_env, system_message, user_keys
from bench.harness import START_S, add_model_option, bench_env, model_folder, onelane_stack, poll_until, rotated
from bench.mlx_server import eos_id, mlx_server
from bench.multiturn import request
from bench.openai_load import stream_once
from bench.report import spread

TIMEOUT_S = 600.0
CHARS_PER_TOKEN = 4.6  # SmolLM2's tokenizer on the system message's English (measured; the report prints the truth)


@dataclass
class FollowUp:
    server: str
    history: int  # the size asked for, in tokens
    ttft: float | None
    prompt_tokens: int
    cached_tokens: int
    first_ttft: float | None  # the first turn's (its whole prompt prefilled), for scale
    error: str | None


Restart = Callable[[], None]


@contextlib.contextmanager
def onelane_killable(model: str, disk: bool, log: Path) -> Iterator[tuple[Server, Restart]]:
    """onelane (worker supervised, web), its disk tier on or off; `restart()` SIGKILLs the worker once its disk
    tier wrote what it was given, and returns when the supervisor's new worker has the model loaded."""
    keys = user_keys(1)
    extra = stack_env(keys, ONELANE_MAX_PROMPT_CHARS="400000", ONELANE_PREFIX_CACHE_DISK="8GiB" if disk else "0")
    with (
        bench_env(model=model) as settings,
        onelane_stack(settings, logs=(log.with_suffix(".worker.log"), log.with_suffix(".web.log")), **extra) as stack,
        serving("onelane" if disk else "onelane, no disk tier", settings, stack.url, keys) as server,
    ):
        store = server.store
        assert store is not None
        folder = settings.prefix_cache_folder

        def restart() -> None:
            if disk and not poll_until(lambda: written(folder), START_S):
                raise RuntimeError("the first turn's entry was not written to disk")
            pid = next(w.pid for w in store.readings.snapshot().workers)
            os.kill(pid, signal.SIGKILL)
            if not poll_until(lambda: any(w.pid != pid and w.models for w in store.readings.snapshot().workers), 120):
                raise RuntimeError("no worker came back after the SIGKILL")

        yield server, restart


def written(folder: Path) -> bool:
    """Whether the disk tier holds an entry (no temporary file pending)."""
    if not folder.exists():
        return False
    names = [p.name for p in folder.iterdir()]
    return any(n.endswith(".safetensors") and not n.startswith(".tmp-") for n in names) and not any(
        n.startswith(".tmp-") for n in names
    )


@contextlib.contextmanager
def mlx_killable(model: str, log: Path) -> Iterator[tuple[Server, Restart]]:
    """mlx_lm.server; `restart()` SIGKILLs it and starts another on the same port's place (a new port)."""
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(mlx_server(model, log))
        server = Server("mlx_lm.server", first.url, eos=eos_id(model))

        def restart() -> None:
            first.process.send_signal(signal.SIGKILL)
            first.process.wait()
            again = stack.enter_context(mlx_server(model, log))
            server.url = again.url

        yield server, restart


def session(start: Callable[[], contextlib.AbstractContextManager], system: str, history: int, answer: int) -> FollowUp:
    with start() as (server, restart):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": QUESTIONS[0]}]
        first = stream_once(server.url, request(server, messages, answer), TIMEOUT_S, auth(server, 0))
        if first.error:
            return FollowUp(server.name, history, None, 0, 0, None, f"first turn: {first.error}")
        restart()
        messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": QUESTIONS[1]}]
        got = stream_once(server.url, request(server, messages, answer), TIMEOUT_S, auth(server, 0))
        usage = got.usage or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return FollowUp(server.name, history, got.ttft, usage.get("prompt_tokens", 0), cached, first.ttft, got.error)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_option(parser)
    parser.add_argument("--history", default="2000,6000", help="history sizes, in tokens (comma-separated)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--answer-tokens", type=int, default=16)
    args = parser.parse_args()
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"onelane-restart-cache-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="onelane-bench-model-") as tmp:
        model = str(model_folder(args.model, Path(tmp)))
        print(f"model {args.model} ({model}); histories {args.history} tokens; {args.rounds} rounds; logs in {logs}")
        results: list[FollowUp] = []
        for history in [int(h) for h in args.history.split(",")]:
            system = system_message(int(history * CHARS_PER_TOKEN))
            variants = [
                ("onelane", lambda log: onelane_killable(model, True, log)),
                ("onelane, no disk tier", lambda log: onelane_killable(model, False, log)),
                ("mlx_lm.server", lambda log: mlx_killable(model, log)),
            ]
            for rnd in range(args.rounds):
                for name, start in rotated(variants, rnd):
                    log = logs / f"h{history}-r{rnd}-{name.replace(' ', '').replace(',', '')}"
                    got = session(lambda: start(log), system, history, args.answer_tokens)
                    results.append(got)
                    print(
                        f"  {history} tokens, round {rnd + 1}, {name}: follow-up TTFT "
                        f"{got.ttft * 1000 if got.ttft else float('nan'):.0f} ms, prompt {got.prompt_tokens}, "
                        f"cached {got.cached_tokens}" + (f", error {got.error}" if got.error else ""),
                        flush=True,
                    )
        report(results)


def report(results: list[FollowUp]) -> None:
    print("\nfollow-up turn after a SIGKILL and a restart (TTFT ms: median, min–max over rounds)")
    print(f"{'history':>8}  {'server':<24} {'TTFT':>22} {'prompt':>7} {'cached':>7} {'first turn':>12}  ratios")
    for history in sorted({r.history for r in results}):
        rows = [r for r in results if r.history == history]
        medians = {}
        for name in dict.fromkeys(r.server for r in rows):
            mine = [r for r in rows if r.server == name]
            ttfts = [r.ttft * 1000 for r in mine if r.ttft is not None and not r.error]
            firsts = [r.first_ttft * 1000 for r in mine if r.first_ttft is not None]
            medians[name] = statistics.median(ttfts) if ttfts else None
            errors = [r.error for r in mine if r.error]
            print(
                f"{history:>8}  {name:<24} {spread(ttfts, '{:.0f}', True) if ttfts else '–':>22} "
                f"{statistics.median([r.prompt_tokens for r in mine]):>7.0f} "
                f"{statistics.median([r.cached_tokens for r in mine]):>7.0f} "
                f"{statistics.median(firsts) if firsts else float('nan'):>12.0f}"
                + (f"  errors: {errors[:2]}" if errors else "")
            )
        ours = medians.get("onelane")
        for peer in ("mlx_lm.server", "onelane, no disk tier"):
            if ours and medians.get(peer):
                print(
                    f"{'':>8}  onelane / {peer}: {ours / medians[peer]:.2f}× the TTFT ({medians[peer] / ours:.1f}× faster)"
                )


if __name__ == "__main__":
    main()
