"""What OpenAI's `n`, log probabilities and penalties cost, on the default model, through the real worker (in this
process, on OpenBLAS).

    ./dev.sh bench choices [--model smollm2|demo|PATH] [--rounds 3] [--n 8] [--words 300] [--jobs 32] [--tokens 64]
                           [--part n|throughput|both]

1. `n` answers of one request against `n` separate requests of the same prompt (a chat message of `--words`
   words, a new one each round, so the prefix cache never holds it), each answer sampled with a seed of its own,
   `--tokens` tokens each, in alternating rounds. Printed per kind: the wall time from admission to the last end,
   the prompt tokens the engine read, and its prefill time (its own counters).
2. `--jobs` chat jobs at once, `--tokens` tokens each (ignore_eos): plain, with logprobs, with top_logprobs 5, and
   with OpenAI's penalties and a logit_bias, in alternating rounds: tokens/s of each and the ratios to plain per
   round.
Every figure is measured in this run.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from bench.harness import InProcess, add_model_option, bench_env, prompt, rotated
from bench.report import spread
from tasks.job import Choice, JobSpec, Message, SamplingParams, new_job_id
from worker.blas import preload_openblas


class Bench(InProcess):
    def admit(self, text: str, choice: Choice | None = None, job_id: str | None = None, **params: Any) -> str:
        messages = (Message(role="user", content=text),)
        spec = JobSpec(
            owner="bench",
            model=self.settings.model_name,
            messages=messages,
            params=SamplingParams(**params),
            choice=choice,
        )
        return self.submit(spec, job_id)


def choices(b: Bench, rounds: int, n: int, words: int, tokens: int) -> None:
    print(
        f"\n== n={n} answers of one request against {n} separate requests: a prompt of {words} words, {tokens} tokens"
    )
    wall: dict[str, list[float]] = {"n": [], "separate": []}
    prefill: dict[str, list[float]] = {"n": [], "separate": []}
    read: dict[str, list[int]] = {"n": [], "separate": []}
    with b.worker():
        b.ended([b.admit(prompt(999, words), max_tokens=4) for _ in range(n)])  # warm up: a batch of n
        for r in range(rounds):
            for kind in rotated(("n", "separate"), r):
                text = f"Summarize: {prompt(r * 2 + (kind == 'n'), words)}"
                before = b.engine.counters
                first = new_job_id()
                ids = [
                    b.admit(
                        text,
                        Choice(group=first, index=i, of=n) if kind == "n" else None,
                        job_id=first if i == 0 else None,
                        max_tokens=tokens,
                        ignore_eos=True,
                        temperature=0.8,
                        seed=100 + i,
                    )
                    for i in range(n)
                ]
                seconds, jobs = b.ended(ids)
                after = b.engine.counters
                wall[kind].append(seconds)
                prefill[kind].append(after.prefill_s - before.prefill_s)
                read[kind].append(after.prompt_tokens - before.prompt_tokens)
                assert len({j.output for j in jobs}) == n, "the seeded answers should differ"
                print(
                    f"  round {r + 1} {kind:>8}: {seconds:.2f} s wall, {read[kind][-1]} prompt tokens read in "
                    f"{prefill[kind][-1]:.2f} s (prompt {jobs[0].usage.prompt_tokens} tokens)"
                )
    for name, values in (("wall", wall), ("prefill", prefill)):
        ratios = [a / s for a, s in zip(values["n"], values["separate"])]
        print(
            f"  {name}: n {spread(values['n'], '{:.2f}', True)} s, separate {spread(values['separate'], '{:.2f}', True)}"
            f" s; n / separate median {statistics.median(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)})"
        )
    print(
        f"  prompt tokens read: n {statistics.median(read['n']):.0f}, separate {statistics.median(read['separate']):.0f}"
    )


KINDS: dict[str, dict[str, Any]] = {
    "plain": {},
    "logprobs": {"logprobs": True},
    "top_logprobs": {"logprobs": True, "top_logprobs": 5},
    "penalties": {"presence_penalty": 0.5, "frequency_penalty": 0.5, "logit_bias": {13: -5.0, 42: 2.0}},
}


def throughput(b: Bench, rounds: int, n: int, tokens: int) -> None:
    print(f"\n== {n} jobs at once, {tokens} tokens each (ignore_eos): plain, with logprobs, with penalties and bias")
    texts = [f"Tell me about {prompt(k, 6)}." for k in range(n)]
    rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with b.worker():
        for kind in KINDS:  # warm up: a full batch of each kind
            b.ended([b.admit(t, max_tokens=8, ignore_eos=True, **KINDS[kind]) for t in texts])
        for r in range(rounds):
            for kind in list(KINDS) if r % 2 == 0 else list(KINDS)[::-1]:
                seconds, jobs = b.ended([b.admit(t, max_tokens=tokens, ignore_eos=True, **KINDS[kind]) for t in texts])
                made = sum(j.usage.completion_tokens for j in jobs)
                assert made == n * tokens
                if "logprobs" in kind:
                    assert all(j.logprobs.count("\n") == tokens for j in jobs)
                rates[kind].append(made / seconds)
                print(f"  round {r + 1} {kind:>12}: {made} tokens in {seconds:.2f} s = {made / seconds:.1f} tok/s")
    for kind in ("logprobs", "top_logprobs", "penalties"):
        ratios = [k / p for k, p in zip(rates[kind], rates["plain"])]
        each = ", ".join(f"{x:.3f}" for x in ratios)
        print(f"  {kind} / plain: median {statistics.median(ratios):.3f}x (rounds: {each})")
    for kind in KINDS:
        print(f"  tok/s {kind}: {spread(rates[kind], '{:.1f}')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_option(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--words", type=int, default=300)
    parser.add_argument("--jobs", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--part", choices=["n", "throughput", "both"], default="both")
    args = parser.parse_args()
    preload_openblas()
    overrides = {"max_batch": max(args.jobs, args.n), "max_queue": 1000, "max_queued_per_user": 1000}
    with bench_env(model=args.model, **overrides) as settings:  # type: ignore[arg-type]
        b = Bench(settings)
        print(f"model {args.model}; rounds {args.rounds}")
        if args.part in ("n", "both"):
            choices(b, args.rounds, args.n, args.words, args.tokens)
        if args.part in ("throughput", "both"):
            throughput(b, args.rounds, args.jobs, args.tokens)


if __name__ == "__main__":
    main()
