"""A conversation through the Responses API's `previous_response_id` vs the same conversation resent whole through
/v1/chat/completions, on onelane, same run, same model, same questions.

    ./dev.sh bench conversations [--model smollm2|demo|PATH] [--turns 6] [--rounds 3] [--system-chars 6000]
                                 [--answer-tokens 16]

Each (round, way) starts onelane afresh, cold, and holds one conversation of --turns turns that opens with the same
long system message (temperature 0, --answer-tokens tokens each, `ignore_eos`; not streamed):
- `resent`: every request carries the system message and the whole history, as chat clients do;
- `chained`: every request carries the system message as `instructions` (OpenAI carries them no further), the new
  question, and `previous_response_id`: the history comes from Redis.
The order of the two ways alternates each round. Per turn: the request's size on the wire, the prompt's tokens, the
tokens read from the prefix cache, and the time to the whole answer. The answers must be the same both ways.
Every figure printed is measured in this run; every process started here is stopped before the script returns.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from bench.chat_servers import QUESTIONS, Server, onelane, system_message
from bench.harness import add_model_option, model_folder, rotated
from bench.report import spread

WAYS = ("resent", "chained")
TIMEOUT_S = 300.0


@dataclass
class Turn:
    n: int
    request_bytes: int
    prompt_tokens: int
    cached_tokens: int
    seconds: float
    answer: str


def post(server: Server, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], int, float]:
    data = json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {server.keys[0]}", "Content-Type": "application/json"}
    started = time.perf_counter()
    answer = requests.post(server.url + path, data=data, headers=headers, timeout=TIMEOUT_S)
    seconds = time.perf_counter() - started
    answer.raise_for_status()
    return answer.json(), len(data), seconds


def resent(server: Server, system: str, turns: int, tokens: int) -> list[Turn]:
    messages = [{"role": "system", "content": system}]
    done = []
    for n in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[n % len(QUESTIONS)]})
        body = {"model": server.model, "messages": messages, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
        got, size, seconds = post(server, "/v1/chat/completions", body)
        text, usage = got["choices"][0]["message"]["content"], got["usage"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        done.append(Turn(n, size, usage["prompt_tokens"], cached, seconds, text))
        messages.append({"role": "assistant", "content": text})
    return done


def chained(server: Server, system: str, turns: int, tokens: int) -> list[Turn]:
    previous: str | None = None
    done = []
    for n in range(turns):
        body = {
            "model": server.model,
            "instructions": system,
            "input": QUESTIONS[n % len(QUESTIONS)],
            "max_output_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            **({"previous_response_id": previous} if previous else {}),
        }
        got, size, seconds = post(server, "/v1/responses", body)
        usage = got["usage"]
        text = got["output"][0]["content"][0]["text"]
        done.append(Turn(n, size, usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"], seconds, text))
        previous = got["id"]
    return done


def table(runs: dict[str, list[list[Turn]]], turns: int) -> list[str]:
    lines = [f"{'turn':>4}  {'way':<8} {'request bytes':>14} {'prompt tokens':>14} {'cached':>8} {'answer s':>22}"]
    for n in range(turns):
        for way in WAYS:
            at = [run[n] for run in runs[way]]
            seconds = [t.seconds for t in at]
            lines.append(
                f"{n + 1:>4}  {way:<8} {statistics.median(t.request_bytes for t in at):>14.0f} "
                f"{statistics.median(t.prompt_tokens for t in at):>14.0f} "
                f"{statistics.median(t.cached_tokens for t in at):>8.0f} "
                f"{spread(seconds, '{:.2f}', short=True):>22}"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    add_model_option(parser)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--system-chars", type=int, default=6000)
    parser.add_argument("--answer-tokens", type=int, default=16)
    args = parser.parse_args()
    system = system_message(args.system_chars)
    runs: dict[str, list[list[Turn]]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="onelane-conversations-") as tmp:
        folder = Path(tmp)
        model = str(model_folder(args.model, folder))
        print(
            f"model {model}; {args.turns} turns, a {len(system)}-character system message, {args.answer_tokens} tokens"
        )
        for rnd in range(args.rounds):
            for way in rotated(WAYS, rnd):
                with onelane(model, 1, True, folder / f"{way}-{rnd}") as server:
                    run = (resent if way == "resent" else chained)(server, system, args.turns, args.answer_tokens)
                runs[way].append(run)
                total = sum(t.seconds for t in run)
                print(f"  round {rnd + 1} {way:<8}: {total:.2f} s for {args.turns} turns")
    same = all(
        [t.answer for t in a] == [t.answer for t in b] for a, b in zip(runs["resent"], runs["chained"], strict=True)
    )
    print()
    print("\n".join(table(runs, args.turns)))
    wire = {way: [sum(t.request_bytes for t in run) for run in runs[way]] for way in WAYS}
    wall = {way: [sum(t.seconds for t in run) for run in runs[way]] for way in WAYS}
    print()
    print(
        f"bytes sent for the conversation: resent {statistics.median(wire['resent']):.0f}, chained "
        f"{statistics.median(wire['chained']):.0f} ({statistics.median(wire['chained']) / statistics.median(wire['resent']):.2f}x)"
    )
    ratios = [c / r for c, r in zip(wall["chained"], wall["resent"], strict=True)]
    print(
        f"time for the conversation (median (min-max)): resent {spread(wall['resent'], '{:.2f}', short=True)} s, "
        f"chained {spread(wall['chained'], '{:.2f}', short=True)} s; chained/resent {spread(ratios, '{:.2f}', short=True)}x"
    )
    print(f"same answers both ways, every round: {same}")


if __name__ == "__main__":
    main()
