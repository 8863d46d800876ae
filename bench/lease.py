"""Lease benchmark: does a live worker keep its device's lease on a loaded machine?

    .venv/bin/python -m bench.lease [--minutes 10] [--hogs 2] [--baseline TREE] [--logs DIR]

An idle `onelane worker` and a busy one (jobs of 80 tokens admitted two at a time, back to back), each with a Redis
of its own, on the shipped demo model and the default lease (3 s), beside `--hogs` CPU hogs (busy loops) for
`--minutes`. With `--baseline`, the same pair from another source tree (a checkout of an earlier commit, say) runs at
the same time beside the same hogs, so both see the same load. Each device's lease is read every 0.1 s.

Reports, per worker: lapses (the lease's holder changed or vanished), the workers its supervisor killed for a stalled
job (each a lapse too, but not for want of renewal), worker restarts and lost-device lines in the log, the lease's least time to live seen, the heartbeat's worst age (seconds
since the heartbeat thread's own renewal), jobs completed and requeued; and the baseline's lapses against this
tree's. Every process started here is stopped before the script returns.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import admit, private_redis, prompt, stop, wait_ended
from tasks import keys
from tasks.broker import make_broker
from tasks.catalogue import SHIPPED_DEMO_MODEL
from tasks.settings import Settings
from tasks.store import Store

ROOT = Path(__file__).resolve().parents[1]
WATCH_S = 0.1


@dataclass
class Watch:
    """What one worker's lease did."""

    name: str
    lapses: int = 0
    least_ttl_ms: int = 10**9
    worst_beat_age_s: float = 0.0
    completed: int = 0
    requeued: int = 0
    restarts: int = 0
    stall_kills: int = 0  # workers its supervisor killed for a job that made no progress (a lapse, but not the lease's)
    lost_lines: int = 0
    holders: list[str] = field(default_factory=list)


@contextmanager
def stack(
    root: Path, name: str, folder: Path, busy: bool, done: threading.Event, keep: Path | None = None
) -> Iterator[Watch]:
    """`onelane worker` of the tree `root` on a Redis of its own, watched (and kept busy) until `done`."""
    watch = Watch(name)
    with private_redis() as (redis_folder, url):
        settings = Settings(redis_url=url, model=str(SHIPPED_DEMO_MODEL), var_dir=redis_folder, device=name)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_PRELOAD", "ONELANE_MODEL")}
        env |= {"REDIS_URL": url, "ONELANE_MODEL": str(SHIPPED_DEMO_MODEL), "ONELANE_DEVICE": name}
        env |= {"ONELANE_VAR_DIR": str(redis_folder), "PYTHONUNBUFFERED": "1"}
        log_path = folder / f"{name}.log"
        with open(log_path, "ab") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "worker", "--supervise"],
                cwd=root,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        store = Store.connect(settings)
        threads = [threading.Thread(target=_watch, args=(store, watch, done), daemon=True)]
        if busy:
            threads.append(threading.Thread(target=_work, args=(settings, store, watch, done), daemon=True))
        for t in threads:
            t.start()
        try:
            yield watch
        finally:
            done.set()
            for t in threads:
                t.join(timeout=120)
            stop(child)
            text = log_path.read_text(errors="replace")
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                (keep / log_path.name).write_text(text)
            watch.restarts = text.count(" exited (")
            watch.lost_lines = text.count("lost device")
            watch.stall_kills = text.count("made no progress for")


def _watch(store: Store, watch: Watch, done: threading.Event) -> None:
    """Read the lease every WATCH_S: a holder that changes or vanishes once held is a lapse."""
    key, last = keys.device(store.settings.device), None
    while not done.wait(WATCH_S):
        pipe = store.redis.pipeline(transaction=False)
        pipe.hget(key, "worker")
        pipe.pttl(key)
        pipe.hget(key, "beat")
        pipe.time()
        holder, ttl, beat, (sec, usec) = pipe.execute()
        if holder and holder not in watch.holders:
            watch.holders.append(holder)
        if last is not None and holder != last:
            watch.lapses += 1
            print(f"  {watch.name}: lease of {last[:8]} lapsed (now {holder and holder[:8]})", flush=True)
        last = holder
        if holder:
            watch.least_ttl_ms = min(watch.least_ttl_ms, ttl)
            watch.worst_beat_age_s = max(watch.worst_beat_age_s, sec + usec / 1e6 - float(beat))


def _work(settings: Settings, store: Store, watch: Watch, done: threading.Event) -> None:
    """Jobs of 80 tokens, two at a time, back to back, once the worker holds the device."""
    broker = make_broker(settings, worker=False)
    n = 0
    while not done.is_set():
        ids = [admit(store, broker, "bench", prompt(n + k), max_tokens=80, ignore_eos=True) for k in range(2)]
        n += 2
        wait_ended(store, ids, 300)
        for job_id in ids:
            events = [e.type for e in store.events(job_id)]
            watch.completed += store.redis.hget(keys.job(job_id), "status") == "completed"
            watch.requeued += events.count("requeued")


def report(watches: list[Watch], minutes: float, load: tuple[float, float]) -> None:
    print(f"\n{minutes:g} min; load average {load[0]:.1f} at the start, {load[1]:.1f} at the end")
    print(f"{'worker':<20} {'lapses':>6} {'stalls':>6} {'restarts':>8} {'lost':>4} {'least ttl':>9} {'worst beat':>10} "
          f"{'done':>5} {'requeued':>8}")  # fmt: skip
    for w in watches:
        print(
            f"{w.name:<20} {w.lapses:>6} {w.stall_kills:>6} {w.restarts:>8} {w.lost_lines:>4} {w.least_ttl_ms / 1000:>8.2f}s "
            f"{w.worst_beat_age_s:>9.2f}s {w.completed:>5} {w.requeued:>8}"
        )

    def lease_lapses(tree: str) -> int:  # (a stall kill ends a lease too, but not for want of renewal)
        return sum(max(w.lapses - w.stall_kills, 0) for w in watches if w.name.startswith(tree))

    if any(w.name.startswith("baseline") for w in watches):
        ours, theirs = lease_lapses("this"), lease_lapses("baseline")
        print(
            f"lease lapses (stall kills aside): this tree {ours}, baseline {theirs} (ratio {theirs / max(ours, 1):.1f}x)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--hogs", type=int, default=2, help="CPU hogs (busy loops) beside the workers")
    parser.add_argument("--baseline", type=Path, help="another source tree whose workers run at the same time")
    parser.add_argument("--logs", type=Path, help="a folder to keep the workers' logs in")
    args = parser.parse_args()
    trees = [("this", ROOT)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    done, start_load = threading.Event(), os.getloadavg()[0]
    with ExitStack() as exits:
        folder = Path(exits.enter_context(private_redis())[0])
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
        exits.callback(lambda: [stop(h, 5) for h in hogs])
        watches = [
            exits.enter_context(stack(root, f"{tree}-{kind}", folder, kind == "busy", done, args.logs))
            for tree, root in trees
            for kind in ("idle", "busy")
        ]
        print(f"trees {', '.join(f'{t}={r}' for t, r in trees)}; {args.hogs} hogs; {args.minutes:g} min", flush=True)
        done.wait(args.minutes * 60)
        end_load = os.getloadavg()[0]
    report(watches, args.minutes, (start_load, end_load))


if __name__ == "__main__":
    main()
