"""The fair order alone, on a simulated device: does it share the device by weight, and how close, over a long window?

    ./dev.sh bench fair_order [--seconds 900] [--clients 16] [--batch 4] [--weights 2,1] [--pace 0.074,0.009,0.0035]
                              [--long-prompt 2000] [--long-answer 512] [--short-prompt 64] [--short-answer 64]

bench/fairness.py measures the whole system on the default model, where one 3-minute window costs 3 minutes and a
busy machine moves the figures. This one keeps everything of the order real and simulates only the device: a real
Redis, the real web app admitting the jobs (POST /v1/jobs, each user with their key and weight, tasks/users.py) and
the worker's real scripts starting them (claim.lua), recording their tokens (append.lua, which charges the answers as
they come), ending them (finish.lua) and reporting the device's pace (lease.lua, which sets the output weight). The
device is a batch of --batch slots on a virtual clock: each step reads up to ONELANE_PREFILL_STEP tokens of each
prompt still being read and draws one token for each sequence past its prompt, and lasts `a + b x sequences + p x
prompt tokens` (--pace: a step's fixed cost, a sequence's, a prompt token's, in seconds: SmolLM2-135M on 2 cores).
A slot that frees is given to the next job in fair order at once; each client sends its next job as its last ends.

Each user's device-seconds within the window are counted as bench/fairness.py counts them (prompt tokens read at p,
tokens generated at b + a / batch), with the order's own account (the token units its jobs were charged), and the
ratio of the two users' device-seconds over the ratio of their weights, at every tenth of the window (how the
shares settle) and at its end. Every figure is measured in this run; the clock is virtual, so a run is repeatable
to the token.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from flask.testing import FlaskClient

from bench.harness import private_redis
from tasks.job import JobStatus
from tasks.settings import Settings
from tasks.store import Store
from tasks.store.worker import BatchReport, Claim
from web import create_app

USERS = ("long", "short")


@dataclass
class Running:
    id: str
    user: str
    prompt: int  # tokens to read
    answer: int  # tokens to generate
    read: int = 0
    generated: int = 0


@dataclass
class Served:
    prompt: int = 0
    generated: int = 0

    def seconds(self, pace: tuple[float, float, float], batch: int) -> float:
        a, b, p = pace
        return self.prompt * p + self.generated * (b + a / batch)


@dataclass(frozen=True)
class Load:
    """Two users' closed-loop load: each keeps `clients` jobs in flight, `long`'s of `shape["long"]` (prompt
    tokens, answer tokens, EOS ignored), `short`'s of `shape["short"]`."""

    shape: dict[str, tuple[int, int]]
    clients: int = 16


def simulate(
    settings: Settings,
    client: FlaskClient,
    load: Load,
    pace: tuple[float, float, float],
    seconds: float,
    mark: Callable[[float, dict[str, Served]], None] = lambda clock, served: None,
) -> dict[str, Served]:
    """Run `load` through onelane's real web admission (`client`, of an app on `settings`) and worker scripts on
    `settings`' Redis (its users are `long` and `short`, keyed `key_of(user)`), for `seconds` of a simulated device of ONELANE_MAX_BATCH slots at
    `pace` (a step's fixed cost, a sequence's, a prompt token's); what each user was served. `mark` is called after
    every step."""
    a, b, p = pace
    batch = settings.max_batch
    store = Store.connect(settings)
    worker = store.for_worker("sim")
    report = BatchReport(
        batch=batch,
        slots=batch,
        tokens_per_s=1.0,
        steps=1,
        decode_s=0,
        prefill_s=0,
        prefill_tokens=0,
        pace=json.dumps({settings.model_name: list(pace)}),
    )
    owner: dict[str, str] = {}

    def submit(user: str) -> None:
        prompt, answer = load.shape[user]  # (" queue": a token each, as the web counts them with the demo tokenizer)
        reply = client.post(
            "/v1/jobs",
            json={"prompt": " queue" * prompt, "max_tokens": answer, "ignore_eos": True},
            headers={"Authorization": f"Bearer {key_of(user)}"},
        )
        assert reply.status_code == 202, reply.get_json()
        owner[reply.get_json()["id"]] = user

    for user in USERS:
        for _ in range(load.clients):
            submit(user)
    running: list[Running] = []
    served = {u: Served() for u in USERS}
    assert worker.take_device(report) == "ok"  # (after the first prompts: the web's counting may take seconds)
    clock, steps, renewed = 0.0, 0, time.monotonic()
    while clock < seconds:
        while len(running) < batch:
            claim = worker.claim_next(want="*")
            assert isinstance(claim, Claim) and claim.started
            user = owner[claim.job.id]
            prompt, answer = load.shape[user]  # (the prompt as the web counted it, if it did: what the worker reads)
            running.append(Running(claim.job.id, user, claim.job.spec.prompt_tokens or prompt, answer))
        reading = [r for r in running if r.read < r.prompt]
        decoding = [r for r in running if r.read >= r.prompt]
        chunk = {r.id: min(settings.prefill_step, r.prompt - r.read) for r in reading}
        clock += a + b * len(decoding) + p * sum(chunk.values())
        steps += 1
        for r in reading:
            r.read += chunk[r.id]
            served[r.user].prompt += chunk[r.id]
        for r in decoding:
            worker.append(r.id, (7,), "x", r.prompt, start=(r.generated, r.generated))
            r.generated += 1
            served[r.user].generated += 1
        for r in [r for r in running if r.generated >= r.answer]:
            ended = worker.finish(
                r.id, JobStatus.COMPLETED, finish_reason="length", prompt_tokens=r.prompt, completion_tokens=r.generated
            )
            assert ended
            running.remove(r)
            submit(r.user)
        if time.monotonic() - renewed > settings.lease_s / 4:  # (the lease lives ONELANE_LEASE_S of real time,
            assert worker.renew_device(report) == "ok"  #          however slowly a loaded machine runs the steps)
            renewed = time.monotonic()
        mark(clock, served)
    store.redis.close()
    return served


def key_of(user: str) -> str:
    return f"bench-{user}-key-0123456789"


def users_of(weights: tuple[int, int]) -> list[dict[str, object]]:
    """The users `long` and `short` of these weights, as Settings take them."""
    return [{"name": u, "key": key_of(u), "weight": w} for u, w in zip(USERS, weights)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=900.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--weights", default="2,1")
    parser.add_argument("--pace", default="0.074,0.009,0.0035")
    parser.add_argument("--long-prompt", type=int, default=2000)
    parser.add_argument("--long-answer", type=int, default=512)
    parser.add_argument("--short-prompt", type=int, default=64)
    parser.add_argument("--short-answer", type=int, default=64)
    args = parser.parse_args()
    w = [int(x) for x in args.weights.split(",")]
    weights = (w[0], w[1])
    a, b, p = (float(x) for x in args.pace.split(","))
    pace = (a, b, p)
    load = Load(
        {"long": (args.long_prompt, args.long_answer), "short": (args.short_prompt, args.short_answer)}, args.clients
    )
    print(
        f"simulated device: batch {args.batch}, step {a * 1000:.1f} ms + {b * 1000:.1f} ms a sequence + "
        f"{p * 1000:.2f} ms a prompt token; {args.clients} clients a user; long {load.shape['long']}, short "
        f"{load.shape['short']} (prompt, answer tokens); weights long:short {weights[0]}:{weights[1]}"
    )
    with private_redis() as (folder, url):
        settings = Settings.model_validate(
            {
                "redis_url": url,
                "model": "demo",
                "var_dir": folder,
                "users": users_of(weights),
                "max_batch": args.batch,
                "max_queue": 1000,
                "max_queued_per_user": 1000,
                "max_tokens_limit": 4096,
                "max_prompt_chars": 400_000,
            }
        )
        marks = [args.seconds * k / 10 for k in range(10, 0, -1)]
        ratios: list[float] = []

        def mark(clock: float, served: dict[str, Served]) -> None:
            if marks and clock >= marks[-1]:
                marks.pop()
                ratios.append(ratio_of(served, pace, args.batch, weights))
                print(line(f"{clock:6.0f} s", served, pace, args.batch, weights), flush=True)

        app = create_app(settings)
        try:
            simulate(settings, app.test_client(), load, pace, args.seconds, mark)
        finally:
            app.extensions["onelane"].stop()
    half = ratios[len(ratios) // 2 :]
    print(
        "long/short device-seconds over the weights at each tenth of the window: "
        + ", ".join(f"{r:.3f}" for r in ratios)
        + f"; over its second half within {max(abs(r - 1) for r in half):.1%} of the weights"
    )


def ratio_of(
    served: dict[str, Served], pace: tuple[float, float, float], batch: int, weights: tuple[int, int]
) -> float:
    seconds = {u: served[u].seconds(pace, batch) for u in USERS}
    return seconds["long"] / seconds["short"] / (weights[0] / weights[1])


def line(
    when: str, served: dict[str, Served], pace: tuple[float, float, float], batch: int, weights: tuple[int, int]
) -> str:
    seconds = {u: served[u].seconds(pace, batch) for u in USERS}
    x = [seconds[u] / w for u, w in zip(USERS, weights)]
    jain = sum(x) ** 2 / (len(x) * sum(v * v for v in x))
    return (
        f"{when}: device-s long {seconds['long']:.0f}, short {seconds['short']:.0f}; long/short over the weights "
        f"{ratio_of(served, pace, batch, weights):.3f}, Jain's index {jain:.3f}"
    )


if __name__ == "__main__":
    main()
