"""The prefix cache: a chat's next turn, which resends the whole history, prefills only what is new; a hit changes
no output; entries stay within their byte cap, their model, and (unless shared) their owner; a job cut short leaves
none; a restart keeps them (the disk tier: tests/test_prefix_disk.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tasks.catalogue import ModelConfig
from tasks.users import User
from tests.helpers import BUSY, JobsClient, claim_now, finished, wait_ended, wait_event
from tests.test_recovery import wait_for_worker

SYSTEM = "You answer questions about queues, GPUs and the people who wait for them, briefly and kindly. " * 12
GREEDY = {"max_tokens": 24, "ignore_eos": True}
SEEDED = {"max_tokens": 24, "ignore_eos": True, "temperature": 0.9, "seed": 3}


def ask(jobs: JobsClient, store, messages: list[dict[str, str]], **params: Any) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    return wait_ended(store, jobs.submit(messages=messages, **params)["id"])


def turns(first: dict[str, Any]) -> list[dict[str, str]]:
    """A second turn: the history, the answer to the first, a new question."""
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is a queue?"},
        {"role": "assistant", "content": first["output"]},
        {"role": "user", "content": "And who waits in it?"},
    ]


FIRST = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is a queue?"}]


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_follow_up_turn_reads_its_history_from_the_cache_and_writes_what_it_would_without(
    params, jobs, store, start_worker
):
    cached = start_worker(max_batch=4)
    first = ask(jobs, store, FIRST, **params)
    assert first["usage"]["cached_tokens"] == 0

    # the follow-up runs while other jobs join the batch and leave it
    others = [jobs.submit(f"other {n}", max_tokens=8 + 4 * n, ignore_eos=True)["id"] for n in range(3)]
    hit = ask(jobs, store, turns(first), **params)
    assert [wait_ended(store, other)["status"] for other in others] == ["completed"] * 3
    prompt, from_cache = hit["usage"]["prompt_tokens"], hit["usage"]["cached_tokens"]
    assert from_cache >= 0.8 * prompt, (from_cache, prompt)  # the history, up to where its answer was re-tokenized

    cached.stop()
    start_worker(max_batch=4, prefix_cache_bytes=0)  # the same job, read from its first token
    miss = ask(jobs, store, turns(first), **params)
    assert miss["usage"]["cached_tokens"] == 0
    assert miss["output"] == hit["output"]


def test_a_prompt_reads_the_entry_that_holds_most_of_it_trimmed_to_what_they_share(engine):
    from worker.prefix_cache import MIN_HIT_TOKENS, PrefixCache

    # Given one entry of 90-odd tokens
    cache = PrefixCache(1 << 30)
    _, kv = finished(engine, "prompt number 0: " + "words " * 80)
    cache.insert(("m", "o"), kv.tokens, kv.cache)
    kept, other = kv.tokens, [t + 1 for t in kv.tokens]

    # When prompts go on past it, part from it midway, are it, or share too little with it
    too_little = kept[: MIN_HIT_TOKENS - 1] + other
    hits = [cache.fetch(("m", "o"), p) for p in (kept + other[:3], kept[:50] + other[50:], kept, too_little)]

    # Then each reads what they share (all but the last token of itself), from a copy trimmed to it
    assert [hit.tokens for hit in hits] == [len(kept), 50, len(kept) - 1, 0]
    assert [hit.cache[0].offset for hit in hits[:3]] == [len(kept), 50, len(kept) - 1]
    assert cache.fetch(("m", "o"), kept + other[:3]).tokens == len(kept)  # the entry itself is whole
    assert cache.fetch(("m", "p"), kept + other[:3]).tokens == 0  # and only its key reads it


def test_entries_stay_within_the_byte_cap_least_recently_used_first(engine):
    from worker.prefix_cache import PrefixCache

    prompts = [f"prompt number {n}: " + "words " * (40 + n) for n in range(6)]
    entries = [finished(engine, p) for p in prompts]
    size = sum(c.nbytes for c in entries[0][1].cache)
    cache = PrefixCache(int(size * 3.5))  # room for three of them

    def kept() -> list[int]:
        return [n for n, (_, kv) in enumerate(entries) if cache.holds(("m", "o"), kv.tokens)]

    for _, kv in entries[:4]:
        cache.insert(("m", "o"), kv.tokens, kv.cache)
        assert cache.nbytes <= cache.max_bytes
    assert kept() == [1, 2, 3]  # the least recently used went first
    assert cache.fetch(("m", "o"), entries[1][0]).tokens > 0  # a hit makes its entry the most recently used
    cache.insert(("m", "o"), entries[4][1].tokens, entries[4][1].cache)
    assert kept() == [1, 3, 4] and cache.nbytes <= cache.max_bytes
    assert cache.nbytes == sum(sum(c.nbytes for c in entries[n][1].cache) for n in (1, 3, 4))  # measured, not guessed

    bigger_than_all = PrefixCache(size // 2)
    bigger_than_all.insert(("m", "o"), entries[0][1].tokens, entries[0][1].cache)
    assert len(bigger_than_all) == 0 and bigger_than_all.nbytes == 0


@pytest.mark.parametrize("shared", [False, True], ids=["own", "shared"])
def test_an_entry_serves_its_owner_only_unless_sharing_is_on(shared, settings, make_app, store, start_worker):
    users = (User(name="alice", key="ka" * 8), User(name="bob", key="kb" * 8))
    keyed = settings.model_copy(update={"users": users, "prefix_cache_shared": shared})
    client = make_app(keyed).test_client()

    def ask_as(key: str) -> dict[str, Any]:
        response = client.post(
            "/v1/jobs", json={"messages": FIRST, **GREEDY}, headers={"Authorization": f"Bearer {key}"}
        )
        assert response.status_code == 202, response.get_json()
        return wait_ended(store, response.get_json()["id"])

    start_worker(users=users, prefix_cache_shared=shared)
    alice = ask_as("ka" * 8)
    bob = ask_as("kb" * 8)
    again = ask_as("ka" * 8)

    assert alice["usage"]["cached_tokens"] == 0 and again["usage"]["cached_tokens"] > 0
    assert (bob["usage"]["cached_tokens"] > 0) is shared
    assert alice["output"] == bob["output"] == again["output"]


@pytest.mark.parametrize("cut", ["cancelled", "time_limit"])
def test_a_job_cut_short_leaves_no_entry(cut, jobs, store, start_worker):
    worker = start_worker(**({"job_time_limit_s": 0.5} if cut == "time_limit" else {}))
    job = jobs.submit(messages=FIRST, max_tokens=BUSY, ignore_eos=True)
    if cut == "cancelled":
        wait_event(store, job["id"], lambda e: e.type == "token")
        jobs.cancel(job["id"])
    assert wait_ended(store, job["id"])["status"] == ("cancelled" if cut == "cancelled" else "failed")
    assert len(worker.models.prefix) == 0

    again = ask(jobs, store, FIRST, **GREEDY)
    assert again["usage"]["cached_tokens"] == 0


def test_an_entry_never_crosses_models(settings, demo_model, tmp_path, make_app, store, start_worker):
    from worker.demo_build.model import make_demo_model

    other = make_demo_model(tmp_path / "other", seed=1)  # the same architecture and tokenizer, other weights
    catalog = (ModelConfig(name="tiny", path=str(demo_model), default=True), ModelConfig(name="other", path=str(other)))
    served = settings.model_copy(update={"model": None, "models": catalog})
    jobs = JobsClient(make_app(served).test_client())
    start_worker(served)
    first = ask(jobs, store, FIRST, model="tiny", **GREEDY)
    elsewhere = ask(jobs, store, FIRST, model="other", **GREEDY)
    again = ask(jobs, store, FIRST, model="tiny", **GREEDY)

    assert elsewhere["usage"]["cached_tokens"] == 0 and again["usage"]["cached_tokens"] > 0
    assert again["output"] == first["output"]


def test_the_same_name_loaded_with_other_options_is_another_model(demo_model):
    plain = ModelConfig(name="m", path=str(demo_model)).cache_key()
    assert plain == ModelConfig(name="m", path=str(demo_model)).cache_key()
    assert plain != ModelConfig(name="m", path=str(demo_model), adapter_path="/adapters/a").cache_key()
    assert plain != ModelConfig(name="m", path=str(demo_model), revision="v2").cache_key()
    assert plain != ModelConfig(name="m", path=str(demo_model), model_config={"rope_theta": 1e4}).cache_key()


@pytest.mark.parametrize("disk", [True, False], ids=["disk-tier", "no-disk-tier"])
def test_a_restart_reads_the_entries_from_the_disk_tier_unless_it_is_off(disk, jobs, store, start_worker):
    # Given a first turn answered, its state in the prefix cache
    options = {} if disk else {"prefix_cache_disk_bytes": 0}
    first_worker = start_worker(**options)
    first = ask(jobs, store, FIRST, **GREEDY)
    first_worker.stop()  # a deploy

    # When the next worker starts, its RAM empty, and the follow-up turn comes
    second_worker = start_worker(**options)
    assert len(second_worker.models.prefix) == 0
    follow_up = ask(jobs, store, turns(first), **GREEDY)

    # Then it reads its history from disk (and keeps it in RAM again), or, with the disk tier off, prefills it all
    counters = second_worker.models.prefix.counters
    if disk:
        assert follow_up["usage"]["cached_tokens"] >= 0.8 * follow_up["usage"]["prompt_tokens"]
        assert (counters.disk_hits, counters.disk_tokens) == (1, follow_up["usage"]["cached_tokens"])
    else:
        assert follow_up["usage"]["cached_tokens"] == 0 and counters.disk_hits == 0
        assert not second_worker.settings.prefix_cache_folder.exists()


def test_cached_tokens_are_reported_as_openai_does_and_counted_in_metrics(live_server, store, start_worker, jobs):
    import openai

    start_worker()
    client = openai.OpenAI(base_url=f"{live_server}/v1", api_key="local", max_retries=0)
    model = store.settings.model_name
    first = client.chat.completions.create(model=model, messages=FIRST, max_tokens=8)  # type: ignore[arg-type]
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    history = [
        *FIRST,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And who waits in it?"},
    ]
    second = client.chat.completions.create(model=model, messages=history, max_tokens=8)  # type: ignore[arg-type]
    assert second.usage.prompt_tokens_details.cached_tokens > 0.8 * second.usage.prompt_tokens

    stream = client.chat.completions.create(
        model=model,
        messages=history,
        max_tokens=8,
        stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )
    usage = [chunk.usage for chunk in stream if chunk.usage][-1]
    assert usage.prompt_tokens_details.cached_tokens > 0.8 * usage.prompt_tokens

    # the worker reports its cache with its next lease renewal: /metrics and the dashboard count the hits
    import requests

    def counted() -> dict[str, float]:
        lines = requests.get(f"{live_server}/metrics", timeout=5).text.splitlines()
        return {line.split()[0]: float(line.split()[1]) for line in lines if line.startswith("onelane_prefix_cache")}

    deadline = time.monotonic() + 10
    while (metrics := counted()).get("onelane_prefix_cache_hits_total", 0) < 2:
        assert time.monotonic() < deadline, metrics
        time.sleep(0.2)  # a poll: the report rides on the lease's renewal, every ONELANE_LEASE_S / 3
    assert metrics["onelane_prefix_cache_lookups_total"] == 3 and metrics["onelane_prefix_cache_tokens_total"] > 0
    assert metrics[f'onelane_prefix_cache_entries{{device="{store.settings.device}"}}'] >= 1
    board = requests.get(f"{live_server}/queue.json", timeout=5).json()["prefix_cache"]
    assert (board["lookups"], board["hits"], board["hit_rate"]) == (3, 2, round(2 / 3, 3))


def conversation_on_two_devices(jobs: JobsClient, store, turns: int, question: str) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    messages = [{"role": "system", "content": SYSTEM}]
    done = []
    for n in range(turns):
        messages.append({"role": "user", "content": f"{question} ({n})"})
        done.append(ask(jobs, store, messages, **GREEDY))
        messages.append({"role": "assistant", "content": done[-1]["output"]})
    return done


@pytest.mark.parametrize("affinity_s", ["2", "0"], ids=["steered", "not steered"])
def test_with_two_devices_a_follow_up_goes_to_the_one_that_holds_its_history(affinity_s, jobs, store, worker_process):
    from tasks import keys

    for device in ("gpu-a", "gpu-b"):
        worker_process(
            supervise=False, ONELANE_DEVICE=device, ONELANE_MAX_BATCH="4", ONELANE_CACHE_AFFINITY_S=affinity_s
        )
    # (both up before the first question: beside busy processes their start outlasts an answer's wait)
    wait_for_worker(store, other_than=wait_for_worker(store, timeout_s=150).pid, timeout_s=150)
    chats = [conversation_on_two_devices(jobs, store, 3, q) for q in ("Où est la file d’attente ?", "Why a queue?")]

    devices = [[store.redis.hget(keys.job(turn["id"]), "device") for turn in chat] for chat in chats]
    assert {d for chat in devices for d in chat} <= {"gpu-a", "gpu-b"}
    # a follow-up hit its history when it read more than the turn before it sent (not only the system message,
    # which every conversation of this owner shares)
    hits = [
        n["usage"]["cached_tokens"] > before["usage"]["prompt_tokens"]
        for chat in chats
        for before, n in zip(chat, chat[1:])
    ]
    print(f"affinity {affinity_s} s: {sum(hits)} of {len(hits)} follow-ups hit their history; devices {devices}")
    if affinity_s != "0":
        assert all(len(set(chat)) == 1 for chat in devices)  # each conversation stayed where its history is
        assert all(hits)
        # a next turn, once admitted, names its history as the turn before it left it (after that turn's device),
        # and runs there
        last = chats[0][-1]
        answered = [*last["messages"], {"role": "assistant", "content": last["output"]}]
        follow_up = jobs.submit(messages=[*answered, {"role": "user", "content": "Et ensuite ?"}], **GREEDY)["id"]
        history = store.redis.hget(keys.job(follow_up), "history")
        assert history and store.redis.get(keys.AFFINITY_PREFIX + history) == devices[0][-1]
        wait_ended(store, follow_up)
        assert store.redis.hget(keys.job(follow_up), "device") == devices[0][-1]


@pytest.mark.parametrize("cached", [0, 3990], ids=["read in full", "mostly cached"])
def test_a_running_jobs_estimate_counts_only_the_prefill_still_to_do(cached, store):
    """Before its first token, a running job frees its slot once what of its prompt is not cached is prefilled and
    its tokens are generated, at the device's measured rates: the next job's ETA says so."""
    from tasks import keys
    from tasks.job import JobSpec, SamplingParams

    # the model's measured pace: 10 ms a step, 1 ms a prompt token (1,000 tokens/s)
    store.redis.hset(keys.model(store.settings.model_name), "pace", "[0.01, 0, 0.001]")
    spec = JobSpec(owner="a", model=store.settings.model_name, prompt="p", params=SamplingParams(max_tokens=10))
    store.admit("job_long", spec, 60)
    assert store.for_worker("w").take_device() == "ok" and claim_now(store, "w").id == "job_long"
    store.for_worker("w").append(
        "job_long", (), "", 4000, cached_tokens=cached
    )  # as the worker does when it joins the batch

    behind = store.admit("job_next", spec.model_copy(update={"owner": "b"}), 60)
    # (less what of its prefill it has done since it started: the forecast counts that time as read, and a loaded
    # machine can take tens of milliseconds between the claim and this admission)
    reading_s = time.time() - float(store.redis.hget(keys.job("job_long"), "started_at"))
    expected = (4000 - cached) / 1000 + 10 * 0.01
    assert behind.position == 1 and expected - reading_s - 0.05 <= behind.eta_s <= expected + 0.05
