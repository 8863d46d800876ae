"""How true the ETA is: a mixed workload on the default model, and for every job that waited, the estimate it was
given at admission (`eta_s` in the 202) and the latest one its stream told before it started, against the wait it
really had.

    ./dev.sh bench eta [--model smollm2|demo|PATH] [--rounds 2] [--max-batch 32] [--seed 1]

One stack (`onelane worker` + `onelane web`, a private Redis, the prefix cache on), serving two models: the default
model (SmolLM2-135M-Instruct imported as float32, as the worker does on a CPU) and `onelane-demo` (worker/demo).
Each round, from a fixed schedule (--seed), over about a minute:
- 3 chat users, each a conversation of 3 turns, each turn resending the history (a prefix-cache hit) once the
  answer before it came; greedy, max_tokens 48 to 160, so most answers end by themselves;
- a burst: one user sends 14 prompts at once, max_tokens 16 to 200, a third of them with ignore_eos;
- a batch-class user (`priority: batch`): 8 jobs of 64 tokens;
- a user of the other model: 6 jobs of 64 to 256 tokens on onelane-demo (each a model switch for the batch).
Every job is followed through its SSE stream (/v1/jobs/<id>/events), which records each `queued` event (position,
eta_s) as it comes. Real wait = started_at - queued_at, from the job's record (Redis's clock; this machine's).
The latest estimate is the last `queued` event before `started`, compared with what was left of the wait when it was
received. Relative error = |estimate - real| / real, over the jobs that waited at least --min-wait seconds; the
jobs that waited less are reported by their absolute error.

The baseline, from the same run: what a queue without a forecast can say, position x the mean service time of
the jobs that ended before the admission / the batch's slots.

    ./dev.sh bench eta --fresh [--rounds 3] [--burst 24] [--max-batch 2] [--seed 1] [--hog N]

`--fresh`: the first estimates a fresh server gives, the ones people decide to wait on. Each round starts a fresh
Redis and stack serving the default model alone (ONELANE_MAX_BATCH 2 unless told), waits until /readyz lists the
model loaded (no job, no warm-up beyond its load), then admits --burst jobs at once from one user, as a new user
would send them: a chat message (a question or a poem on a topic), greedy, max_tokens the page's 64, 128 or the
API's default, seeded. The same figures, per round and over all rounds.

`--hog N` (either mode): N busy processes keep N cores loaded from before the first server starts to the end, as a
machine shared with other work (the figures then hold for that machine: the worker measures its pace beside them).

Every figure printed is measured in this run; every process started here is stopped before the script returns.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import requests

from bench.harness import START_S, add_model_option, cpu_hogs, model_folder, onelane_stack, poll_until, private_redis
from bench.report import pct
from tasks.catalogue import DEFAULT_MODEL, SHIPPED_DEMO_MODEL
from tasks.settings import Settings

DEMO = "onelane-demo"
TOPICS = ["queues", "GPUs", "the sea", "bread", "trains", "bees", "winter", "maps", "clocks", "tea"]


@dataclass
class Followed:
    """One job as the bench saw it."""

    kind: str
    position: int
    first_eta: float | None
    admitted_at: float  # this machine's clock, when the 202 came
    told: list[tuple[float, float | None]] = field(default_factory=list)  # (received at, eta_s) of queued events
    started_at: float | None = None  # the job's record
    queued_at: float | None = None
    finished_at: float | None = None
    status: str = ""
    output: str = ""
    tokens: int | None = None  # it generated
    baseline: float | None = None


@dataclass
class Run:
    url: str
    model: str
    slots: int
    jobs: list[Followed] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def mean_service(self) -> float | None:
        with self.lock:
            done = [j.finished_at - j.started_at for j in self.jobs if j.finished_at and j.started_at]
        return sum(done) / len(done) if done else None

    def submit(self, kind: str, body: dict[str, object], user: str) -> Followed | None:
        """Admit a job and follow it on its own thread; None if it was refused."""
        mean = self.mean_service()
        reply = requests.post(f"{self.url}/v1/jobs", json=body, headers=auth(user), timeout=60)
        if reply.status_code != 202:
            self.errors.append(f"{reply.status_code} {reply.text[:100]}")
            return None
        job = reply.json()
        seen = Followed(kind, job["position"], job["eta_s"], time.time())
        if mean is not None:
            seen.baseline = job["position"] * mean / self.slots
        with self.lock:
            self.jobs.append(seen)
        thread = threading.Thread(target=self.follow, args=(job["id"], seen, user), daemon=True)
        thread.start()
        self.threads.append(thread)
        return seen

    def follow(self, job_id: str, seen: Followed, user: str) -> None:
        """Read the job's stream to its end, noting each estimate as it comes; then its record."""
        with requests.get(f"{self.url}/v1/jobs/{job_id}/events", headers=auth(user), stream=True, timeout=600) as s:
            event = ""
            for line in s.iter_lines(decode_unicode=True):
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: ") and event == "queued" and seen.started_at is None:
                    seen.told.append((time.time(), json.loads(line.removeprefix("data: "))["eta_s"]))
        job = requests.get(f"{self.url}/v1/jobs/{job_id}", headers=auth(user), timeout=60).json()
        t = job["timings"]
        seen.queued_at, seen.started_at, seen.finished_at = t["queued_at"], t["started_at"], t["finished_at"]
        seen.status, seen.output = job["status"], job["output"]
        seen.tokens = (job.get("usage") or {}).get("completion_tokens")

    def wait_for(self, seen: Followed | None) -> None:
        while seen is not None and not seen.status:
            time.sleep(0.05)  # (the follower thread fills it in; nothing else to wait on from here)


def auth(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer key-{user}"}


def keys_env() -> dict[str, str]:
    users = ["chat0", "chat1", "chat2", "burst", "batcher", "other"]
    return {"ONELANE_API_KEYS": ",".join(f"{u}:key-{u}" for u in users)}


def chat_user(run: Run, user: str, rng: random.Random, start_s: float) -> None:
    time.sleep(start_s)
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are a helpful assistant. Be clear."}]
    for turn in range(3):
        messages.append({"role": "user", "content": f"Tell me something about {rng.choice(TOPICS)}."})
        body = {"model": run.model, "messages": messages, "max_tokens": rng.choice([48, 96, 160]), "temperature": 0}
        seen = run.submit("chat" if turn == 0 else "chat (cache hit)", body, user)
        run.wait_for(seen)
        messages.append({"role": "assistant", "content": seen.output if seen else "I see."})
        time.sleep(rng.uniform(0.5, 3.0))  # the user reads, then types


def burst_user(run: Run, rng: random.Random, start_s: float) -> None:
    time.sleep(start_s)
    for n in range(14):
        ignore = n % 3 == 0
        body = {
            "model": run.model,
            "prompt": f"Write about {rng.choice(TOPICS)} and {rng.choice(TOPICS)}." * rng.choice([1, 4, 16]),
            "max_tokens": rng.choice([16, 64, 128, 200]),
            "temperature": 0,
            "ignore_eos": ignore,
        }
        run.submit("burst, ignore_eos" if ignore else "burst", body, "burst")


def batch_user(run: Run, rng: random.Random, start_s: float) -> None:
    time.sleep(start_s)
    for _ in range(8):
        body = {"model": run.model, "prompt": f"Summarise {rng.choice(TOPICS)}.", "max_tokens": 64, "priority": "batch"}
        run.submit("batch class", body, "batcher")
        time.sleep(rng.uniform(0.2, 1.5))


def other_model_user(run: Run, rng: random.Random, start_s: float) -> None:
    time.sleep(start_s)
    for _ in range(6):
        body = {"model": DEMO, "prompt": f"The {rng.choice(TOPICS)}", "max_tokens": rng.choice([64, 128, 256])}
        run.submit("other model", body, "other")
        time.sleep(rng.uniform(2.0, 6.0))


def one_round(run: Run, seed: int) -> None:
    rng = random.Random(seed)
    plan = [
        *(threading.Thread(target=chat_user, args=(run, f"chat{u}", random.Random(seed * 10 + u), u * 4.0))
          for u in range(3)),
        threading.Thread(target=burst_user, args=(run, random.Random(seed * 10 + 5), rng.uniform(3, 8))),
        threading.Thread(target=batch_user, args=(run, random.Random(seed * 10 + 6), rng.uniform(0, 5))),
        threading.Thread(target=other_model_user, args=(run, random.Random(seed * 10 + 7), rng.uniform(5, 10))),
    ]  # fmt: skip
    for t in plan:
        t.start()
    for t in plan:
        t.join()
    for t in run.threads:
        t.join()


def models_file(folder: Path, model: Path, demo: bool = True) -> Path:
    path = folder / "models.toml"
    other = f'\n[models.{DEMO}]\npath = "{SHIPPED_DEMO_MODEL}"\n' if demo else ""
    path.write_text(f'[models.{DEFAULT_MODEL}]\npath = "{model}"\ndefault = true\n{other}')
    return path


def errors_of(jobs: list[Followed], min_wait: float) -> dict[str, list[float]]:
    """Relative errors of the first and latest estimates (jobs that waited min_wait or more), absolute errors of
    those that waited less, and the baseline's relative errors."""
    out: dict[str, list[float]] = {"first": [], "latest": [], "baseline": [], "short first": [], "short latest": []}
    for j in jobs:
        if j.started_at is None or j.queued_at is None or j.first_eta is None:
            continue
        real = j.started_at - j.queued_at
        latest = [(at, eta) for at, eta in j.told if eta is not None and at <= j.started_at]
        if real >= min_wait:
            out["first"].append(abs(j.first_eta - real) / real)
            if j.baseline is not None:
                out["baseline"].append(abs(j.baseline - real) / real)
            if latest:
                at, eta = latest[-1]
                left = j.started_at - at
                if left >= min_wait:
                    out["latest"].append(abs(eta - left) / left)
        else:
            out["short first"].append(abs(j.first_eta - real))
            if latest:
                at, eta = latest[-1]
                out["short latest"].append(abs(eta - (j.started_at - at)))
    return out


def report(jobs: list[Followed], min_wait: float) -> None:
    errors = errors_of(jobs, min_wait)
    started = [j for j in jobs if j.started_at is not None]
    waits = [j.started_at - j.queued_at for j in started if j.queued_at is not None]  # type: ignore[operator]
    print(
        f"\n{len(jobs)} jobs, {len(started)} started; real waits p50 {pct(waits, 50):.1f} s, p90 {pct(waits, 90):.1f} "
        f"s, max {max(waits):.1f} s; {len(errors['first'])} waited >= {min_wait:g} s"
    )
    print(f"\nrelative error, jobs that waited >= {min_wait:g} s       p50      p90     jobs")
    for label, name in (
        ("first estimate (at admission)", "first"),
        ("latest estimate (before it started)", "latest"),
        ("baseline: position x mean service / slots", "baseline"),
    ):
        e = errors[name]
        if e:
            print(f"  {label:<46} {pct(e, 50) * 100:>5.0f} % {pct(e, 90) * 100:>6.0f} % {len(e):>7}")
    for label, name in (("first", "short first"), ("latest", "short latest")):
        e = errors[name]
        if e:
            print(
                f"  absolute error of the {label} estimate, jobs that waited < {min_wait:g} s: p50 "
                f"{pct(e, 50):.2f} s, p90 {pct(e, 90):.2f} s ({len(e)} jobs)"
            )
    by_kind: dict[str, list[float]] = {}
    for j in started:
        if j.queued_at is not None and j.first_eta is not None and j.started_at - j.queued_at >= min_wait:  # type: ignore[operator]
            real = j.started_at - j.queued_at  # type: ignore[operator]
            by_kind.setdefault(j.kind, []).append(abs(j.first_eta - real) / real)
    print(
        "  first estimate by kind: "
        + "; ".join(f"{k} p50 {pct(v, 50) * 100:.0f} % ({len(v)})" for k, v in sorted(by_kind.items()))
    )


def measured_pace(redis_url: str, model: str) -> str | None:
    """The model's pace as the worker last reported it (worker/pace.py)."""
    from tasks import keys
    from tasks.connection import connect

    return connect(redis_url).hget(keys.model(model), "pace")


def print_jobs(jobs: list[Followed]) -> None:
    print("\n  admitted  kind                    pos  first eta   real wait  tokens   told (s after admission: eta)")
    t0 = min(j.admitted_at for j in jobs)
    for j in sorted(jobs, key=lambda j: j.admitted_at):
        real = j.started_at - j.queued_at if j.started_at and j.queued_at else None
        told = " ".join(f"{at - j.admitted_at:.0f}:{eta}" for at, eta in j.told[:8])
        print(
            f"  {j.admitted_at - t0:>7.1f}  {j.kind:<23} {j.position:>3}  {j.first_eta!s:>9}   "
            f"{real if real is None else round(real, 2)!s:>9}  {j.tokens!s:>6}   {told}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_option(parser)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-batch", type=int, default=None, help="32; 2 with --fresh")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--min-wait", type=float, default=1.0)
    parser.add_argument("--jobs", action="store_true", help="print every job: kind, position, estimates, real wait")
    parser.add_argument("--fresh", action="store_true", help="the first jobs of fresh servers (see the docstring)")
    parser.add_argument("--burst", type=int, default=24, help="with --fresh: the jobs admitted at once")
    parser.add_argument("--hog", type=int, default=0, help="CPU hogs (busy processes) running throughout")
    args = parser.parse_args()
    with cpu_hogs(args.hog):
        if args.hog:
            print(f"{args.hog} CPU hog(s) running from the start", flush=True)
        if args.fresh:
            fresh(args)
        else:
            steady(args)


def steady(args: argparse.Namespace) -> None:
    """--rounds rounds of the mixed workload on one warmed-up stack."""
    args.max_batch = args.max_batch or 32
    with private_redis() as (folder, redis_url):
        model = model_folder(args.model, folder)
        settings = Settings(redis_url=redis_url, var_dir=folder)
        env = {
            **keys_env(),
            "ONELANE_MAX_BATCH": str(args.max_batch),
            "ONELANE_MODEL": "",  # (unset: the models file names both)
            "ONELANE_MODELS_FILE": str(models_file(folder, model)),
        }
        print(
            f"model {model} beside {DEMO}; ONELANE_MAX_BATCH {args.max_batch}; {args.rounds} round(s); load average "
            f"{os.getloadavg()[0]:.2f}; logs in {folder}",
            flush=True,
        )
        with onelane_stack(settings, quiet=True, **env) as stack:
            run = Run(stack.url, DEFAULT_MODEL, args.max_batch)
            warm_up(run)
            rounds(run, args)
            paces = {m: measured_pace(redis_url, m) for m in (DEFAULT_MODEL, DEMO)}
        print("\nall rounds:")
        report(run.jobs, args.min_wait)
        print(
            "measured pace (s a step, s a sequence, s a prompt token): "
            + "; ".join(f"{m} {pace}" for m, pace in paces.items())
        )
        if run.errors:
            print(f"refused or failed submissions: {run.errors[:3]}")


# --- --fresh: the first jobs a fresh server sees ------------------------------------------------------------------

ASKS = ["Tell me something about {}.", "Write a short poem about {}.", "Explain {} to a child.", "What are {} for?"]
LIMITS = [(64, "64 tokens (the page's)"), (None, "the API's default"), (128, "128 tokens")]


def fresh(args: argparse.Namespace) -> None:
    """--rounds fresh servers, one after another; each: --burst jobs at once, as soon as its model has loaded."""
    args.max_batch = args.max_batch or 2
    jobs: list[Followed] = []
    with tempfile.TemporaryDirectory(prefix="onelane-bench-model-") as tmp:
        model = model_folder(args.model, Path(tmp))
        print(
            f"model {model}; ONELANE_MAX_BATCH {args.max_batch}; {args.rounds} fresh server(s), {args.burst} jobs at "
            f"once each; load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        for rnd in range(args.rounds):
            seen, pace = fresh_round(model, args, random.Random(args.seed + rnd))
            print(f"  server {rnd + 1}: {len(seen)} jobs; pace (s a step, s a sequence, s a prompt token) {pace}")
            report(seen, args.min_wait)
            if args.jobs:
                print_jobs(seen)
            jobs += seen
    print("\nall fresh servers:")
    report(jobs, args.min_wait)


def fresh_round(model: Path, args: argparse.Namespace, rng: random.Random) -> tuple[list[Followed], str]:
    """A fresh Redis and stack serving the model alone; once it has loaded (no job before), the burst at once."""
    with private_redis() as (folder, redis_url):
        env = {
            **keys_env(),
            "ONELANE_MAX_BATCH": str(args.max_batch),
            "ONELANE_MODEL": "",
            "ONELANE_MODELS_FILE": str(models_file(folder, model, demo=False)),
            "ONELANE_JOB_TTL": "3600",  # (a busy machine may take longer than the default's 10 minutes)
        }
        with onelane_stack(Settings(redis_url=redis_url, var_dir=folder), quiet=True, **env) as stack:
            if not poll_until(lambda: loaded(stack.url), START_S):
                raise RuntimeError(f"{DEFAULT_MODEL} did not load within {START_S:.0f} s (logs in {folder})")
            told = measured_pace(redis_url, DEFAULT_MODEL)
            run = Run(stack.url, DEFAULT_MODEL, args.max_batch)
            bodies = []
            for _ in range(args.burst):
                limit, kind = rng.choice(LIMITS)
                ask = rng.choice(ASKS).format(rng.choice(TOPICS))
                body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": ask}], "temperature": 0}
                bodies.append((kind, body if limit is None else {**body, "max_tokens": limit}))
            gate = threading.Barrier(len(bodies))

            def submit(kind_body: tuple[str, dict[str, object]]) -> None:
                gate.wait()
                run.submit(*kind_body, "burst")

            with ThreadPoolExecutor(len(bodies)) as pool:
                list(pool.map(submit, bodies))
            for t in run.threads:
                t.join()
            return run.jobs, f"{told} before the first job, {measured_pace(redis_url, DEFAULT_MODEL)} at the end"


def loaded(url: str) -> bool:
    """The default model has loaded (/readyz lists it `loaded`)."""
    models = requests.get(f"{url}/readyz", timeout=10).json().get("models") or []
    return any(m["name"] == DEFAULT_MODEL and m["state"] == "loaded" for m in models)


def warm_up(run: Run) -> None:
    """Both models loaded, their pace measured on a few prompts of several lengths together, as a server that has
    served a little (every figure printed is from the rounds)."""
    for model_name in (DEFAULT_MODEL, DEMO):
        warm = [
            run.submit("warm-up", {"model": model_name, "prompt": "Hello. " * 30 * n, "max_tokens": 16}, "chat0")
            for n in (1, 2, 4, 8)
        ]
        for seen in warm:
            run.wait_for(seen)
    run.jobs.clear()


def rounds(run: Run, args: argparse.Namespace) -> None:
    """Each round's schedule, and its figures."""
    for rnd in range(args.rounds):
        before = len(run.jobs)
        one_round(run, args.seed + rnd)
        print(f"  round {rnd + 1}: {len(run.jobs) - before} jobs; refused {len(run.errors)}", flush=True)
        report(run.jobs[before:], args.min_wait)
        if args.jobs:
            print_jobs(run.jobs[before:])


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
