"""The prefix cache's disk tier: entries go to disk as they are made; a worker started after a SIGKILL, or one
sharing the folder, reads a session's history from there; a torn or foreign file is never loaded; the files stay
within their bounds, a user's and the folder's, the least recently used going first."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tasks import keys
from tests.helpers import finished, wait_ended
from tests.test_recovery import wait_for_worker

KEY = ("model", "alice")


def tier(  # type: ignore[no-untyped-def]
    folder: Path, max_bytes: int = 1 << 34, owner_bytes: int = 1 << 34, weights: str = "w1"
):
    """A worker's prefix cache over `folder` (a worker of its own: its RAM starts empty), serving KEY's model with
    the weights `weights`."""
    from worker.prefix_cache import PrefixCache
    from worker.prefix_disk import DiskTier

    disk = DiskTier(folder, max_bytes, owner_bytes)
    disk.serve(KEY[0], weights)
    disk.start()
    return PrefixCache(1 << 30, disk)


def files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def same_state(a: list[Any], b: list[Any]) -> bool:
    import mlx.core as mx

    return all(
        x.offset == y.offset and mx.array_equal(x.keys[..., : x.offset, :], y.keys[..., : y.offset, :]).item()
        for x, y in zip(a, b, strict=True)
    )


def test_an_entry_written_by_one_worker_is_read_by_another_sharing_the_folder(engine, tmp_path):
    # Given two workers sharing a folder, both started before anything is in it
    writer, reader = tier(tmp_path), tier(tmp_path)
    tokens, kv = finished(engine, "prompt number 0: " + "words " * 80)

    # When the first keeps a finished sequence (its writer thread writes it)
    writer.insert(KEY, kv.tokens, kv.cache)
    writer.disk.flush()

    # Then the second reads it from disk for a prompt that goes on past it: the same state, now in its RAM too
    follow_up = kv.tokens + tokens[:5]
    hit = reader.fetch(KEY, follow_up)
    assert hit.tokens == len(kv.tokens) and same_state(hit.cache, kv.cache)
    assert (reader.counters.disk_hits, reader.counters.disk_tokens) == (1, len(kv.tokens))
    assert reader.holds(KEY, kv.tokens)
    assert reader.fetch(KEY, follow_up).tokens == len(kv.tokens) and reader.counters.disk_hits == 1  # (RAM now)
    # And only its key reads it; the file is the folder owner's alone
    assert reader.fetch(("model", "bob"), follow_up).tokens == 0
    assert tmp_path.stat().st_mode & 0o077 == 0


def damage_data(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(-100, os.SEEK_END)
        byte = f.read(1)
        f.seek(-100, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))


def damage_tokens(path: Path) -> None:  # the header says it holds other tokens (a digit changed)
    data = path.read_bytes()
    at = data.index(b'"0.tokens":"') + len(b'"0.tokens":"')
    digit = data[at : at + 1]
    path.write_bytes(data[:at] + (b"1" if digit != b"1" else b"2") + data[at + 1 :])


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


@pytest.mark.parametrize("damage", [damage_data, damage_tokens, truncate], ids=["data", "tokens", "truncated"])
def test_a_torn_or_damaged_file_is_removed_never_loaded(damage, engine, tmp_path):
    # Given an entry on disk, then damaged as a crash or a bad disk would leave it
    first = tier(tmp_path)
    _, kv = finished(engine, "prompt number 1: " + "words " * 80)
    first.insert(KEY, kv.tokens, kv.cache)
    first.disk.flush()
    (path,) = files(tmp_path)
    damage(path)

    # When another worker looks up what its header says it holds
    from worker.prefix_file import header

    said = [int(t) for t in header(path)["tokens"].split(",")]
    second = tier(tmp_path)
    hit = second.fetch(KEY, said + [1, 2])

    # Then nothing is read from it, and it is gone
    assert hit.tokens == 0 and second.counters.disk_hits == 0
    assert second.disk.counters.passed_over == 1 and not path.exists()


def test_a_foreign_file_is_passed_over_and_left_alone(engine, tmp_path):
    import mlx.core as mx

    # Given files another program put in the folder: a safetensors file named as ours, one of its own name, text
    ours = tier(tmp_path)
    _, kv = finished(engine, "prompt number 2: " + "words " * 80)
    ours.insert(KEY, kv.tokens, kv.cache)
    ours.disk.flush()
    mx.save_safetensors(str(tmp_path / ("ab" * 16 + ".safetensors")), {"w": mx.zeros((4, 4))}, {"0.model": "model"})
    (tmp_path / ("cd" * 16 + ".safetensors")).write_text("not a tensor file")
    (tmp_path / "notes.txt").write_text("hello")

    # When a worker starts on the folder and looks up a prompt
    second = tier(tmp_path)
    hit = second.fetch(KEY, kv.tokens + [1, 2])

    # Then our entry is read, the others passed over, once, and left where they were
    assert hit.tokens == len(kv.tokens) and second.counters.disk_hits == 1
    assert second.disk.counters.passed_over == 2 and len(second.disk) == 1
    assert len(files(tmp_path)) == 3 and (tmp_path / "notes.txt").exists()


def test_files_stay_within_a_users_bound_and_the_folders_least_recently_used_first(engine, tmp_path):
    prompts = [f"prompt number {n}: " + "words " * 60 for n in range(5)]
    entries = [finished(engine, p)[1] for p in prompts]
    probe = tier(tmp_path / "probe")
    probe.insert(KEY, entries[0].tokens, entries[0].cache)
    probe.disk.flush()
    size = files(tmp_path / "probe")[0].stat().st_size  # (all five are within a few bytes of it)

    # Given a folder with room for three entries, two of them a user's
    cache = tier(tmp_path / "shared", max_bytes=int(size * 3.5), owner_bytes=int(size * 2.5))
    alice, bob = ("model", "alice"), ("model", "bob")

    def kept(key: tuple[str, str]) -> list[int]:
        disk = tier(tmp_path / "shared")  # (another worker's view: what the files say)
        return [n for n, kv in enumerate(entries) if disk.fetch(key, [*kv.tokens, 1]).tokens == len(kv.tokens)]

    # When alice's sessions outgrow her share
    for kv in entries[:3]:
        cache.insert(alice, kv.tokens, kv.cache)
        cache.disk.flush()
    assert kept(alice) == [1, 2]  # her least recently used went

    # And bob's sessions then outgrow the folder
    cache.insert(bob, entries[3].tokens, entries[3].cache)
    cache.disk.flush()
    os.utime(files(tmp_path / "shared")[0], (1, 1))  # (one of alice's, made the oldest: as if unused for long)
    cache.insert(bob, entries[4].tokens, entries[4].cache)
    cache.disk.flush()

    # Then the folder's least recently used went, whoever's it was, and the files stay within the bounds
    assert len(kept(alice)) == 1 and kept(bob) == [3, 4]
    assert sum(f.stat().st_size for f in files(tmp_path / "shared")) <= size * 3.5


def test_a_longer_turn_of_a_session_replaces_the_shorter_on_disk(engine, tmp_path):
    # Given a session's first turn on disk
    cache = tier(tmp_path)
    first_tokens, first = finished(engine, "prompt number 3: " + "words " * 60)
    cache.insert(KEY, first.tokens, first.cache)
    cache.disk.flush()

    # When its next turn, which starts with all of it, ends
    _, second = finished(engine, [*first.tokens, *first_tokens[:8]])
    cache.insert(KEY, second.tokens, second.cache)
    cache.disk.flush()

    # Then one file holds the session, and serves the first turn's prompt trimmed
    assert len(files(tmp_path)) == 1
    assert tier(tmp_path).fetch(KEY, [*first.tokens, 7]).tokens == len(first.tokens)


def conversation(words: int) -> list[dict[str, str]]:
    """A long chat's history: a system prompt, then turns of varied sentences."""
    vocabulary = "queue device worker token batch prompt answer lease redis model cache history user wait".split()
    turns = [{"role": "system", "content": "You answer questions about queues, briefly."}]
    for n in range(6):
        said = " ".join(vocabulary[(n * 7 + i * i) % len(vocabulary)] for i in range(words // 12))
        turns += [{"role": "user", "content": f"Turn {n}: {said}?"}, {"role": "assistant", "content": f"{said}."}]
    return turns


def disk_files_holding(folder: Path, tokens: int, timeout_s: float = 60.0) -> None:
    """Wait until the folder holds an entry file of at least `tokens` tokens (the worker's writer wrote it)."""
    from worker.prefix_file import FILE, header

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for path in folder.glob("*.safetensors") if folder.exists() else ():
            if FILE.match(path.name) and len(header(path)["tokens"].split(",")) >= tokens:
                return
        time.sleep(0.05)
    raise AssertionError(f"no entry of {tokens} tokens written to {folder}")


def test_a_session_outlives_a_worker_killed_between_turns(jobs, store, worker_process, tmp_path):
    # Given a 6,000-token conversation's turn answered by a worker, whose disk tier wrote its state
    worker_process()
    history = conversation(words=4000)
    first = wait_ended(store, jobs.submit(messages=history, max_tokens=16, ignore_eos=True)["id"], timeout_s=120)
    assert first["status"] == "completed", first
    assert first["usage"]["prompt_tokens"] >= 6000
    disk_files_holding(tmp_path / "prefix-cache", first["usage"]["prompt_tokens"])

    # When the worker is SIGKILLed between turns (its supervisor starts another), and the next turn comes
    killed = wait_for_worker(store)
    os.kill(killed.pid, signal.SIGKILL)
    wait_for_worker(store, other_than=killed.pid)
    follow_up = [*history, {"role": "assistant", "content": first["output"]}, {"role": "user", "content": "Why?"}]
    after_crash = wait_ended(store, jobs.submit(messages=follow_up, max_tokens=24)["id"], timeout_s=120)

    # Then it read at least 90 % of its prompt from disk (the new worker's RAM was empty)
    prompt, cached = after_crash["usage"]["prompt_tokens"], after_crash["usage"]["cached_tokens"]
    assert cached >= 0.9 * prompt, (cached, prompt)
    deadline = time.monotonic() + 30
    while int(store.redis.hget(keys.STATS, "cache_disk_tokens") or 0) < cached:  # (told with the lease's renewal)
        assert time.monotonic() < deadline, store.redis.hgetall(keys.STATS)
        time.sleep(0.05)
    # And its answer is the one a warm cache gives (greedy): the same turn again, read from RAM
    warm = wait_ended(store, jobs.submit(messages=follow_up, max_tokens=24)["id"], timeout_s=120)
    assert warm["usage"]["cached_tokens"] >= 0.9 * prompt
    assert after_crash["output"] == warm["output"] and after_crash["output"]


def test_a_temporary_file_a_killed_writer_left_is_removed_once_an_hour_old(tmp_path):
    # Given the temporary files of two writers killed mid-write: one an hour ago, one now (perhaps another host's)
    old, fresh = tmp_path / ".tmp-old.safetensors", tmp_path / ".tmp-fresh.safetensors"
    for path in (old, fresh):
        path.write_bytes(b"\0" * 64)
    os.utime(old, (time.time() - 3700, time.time() - 3700))

    # When a worker starts on the folder
    tier(tmp_path)

    # Then the old one is gone, and the fresh one left to its writer
    assert not old.exists() and fresh.exists()


def test_a_model_retrained_in_place_reads_none_of_its_old_entries(engine, tmp_path):
    from worker.prefix_file import weights_digest

    # Given an entry on disk of a model whose weights were then retrained at the same path, with the same options
    first = tier(tmp_path, weights=weights_digest(engine.model))
    _, kv = finished(engine, "prompt number 4: " + "words " * 60)
    first.insert(KEY, kv.tokens, kv.cache)
    first.disk.flush()
    retrained = engine.model.parameters()["model"]["norm"]["weight"] * 1.5  # (one vector changed is enough)

    # When a worker serving the new weights looks the prompt up, Then it reads nothing; the old weights' worker does
    import mlx.core as mx

    old = engine.model.model.norm.weight
    try:
        engine.model.model.norm.weight = retrained
        assert tier(tmp_path, weights=weights_digest(engine.model)).fetch(KEY, [*kv.tokens, 1]).tokens == 0
    finally:
        engine.model.model.norm.weight = old
    assert mx.array_equal(engine.model.model.norm.weight, old).item()
    assert tier(tmp_path, weights=weights_digest(engine.model)).fetch(KEY, [*kv.tokens, 1]).tokens == len(kv.tokens)


def test_a_sequence_written_again_stays_in_the_index_and_is_read(engine, tmp_path):
    # Given a sequence on disk, written a second and a third time with other bytes (a state read in another batch
    # rounds otherwise: a file of another digest each time)
    from worker.prefix_disk import compute_state

    cache = tier(tmp_path)
    tokens, kv = finished(engine, "prompt number 5: " + "words " * 40)
    _, other = finished(engine, "prompt number 6: " + "words " * 40)
    for state in (kv.cache, other.cache, kv.cache):
        compute_state(state)  # (as the RAM tier hands it over: nothing left to compute on the writer's thread)
        cache.disk.write((KEY, tuple(kv.tokens)), state, True, 1)
        cache.disk.flush()

    # Then one file holds it, the index still knows it (the writer did not fail on it), and a prompt going on from it
    # is read from disk
    assert len(files(tmp_path)) == 1 and len(cache.disk) == 1
    assert cache.disk.nearest(KEY, (*kv.tokens, tokens[0]), 1) == (tuple(kv.tokens), len(kv.tokens))
    assert cache.fetch(KEY, [*kv.tokens, *tokens[:3]]).tokens == len(kv.tokens)
