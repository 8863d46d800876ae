"""The live feed: every token exactly once and in order, resumable, with position while waiting."""

from __future__ import annotations

import json
import time

import pytest
import requests

from tasks import keys
from tasks.events import TERMINAL
from tests.helpers import BUSY, EventStream, claim_now, wait_ended, wait_event


def read_until(stream: EventStream, stop) -> list[dict]:  # type: ignore[no-untyped-def]
    seen = []
    for item in stream:
        seen.append(item)
        if stop(item):
            break
    return seen


def test_late_subscriber_gets_every_token_once_in_order_then_the_stream_ends(jobs, store, start_worker, live_server):
    start_worker()
    job = jobs.submit("late", max_tokens=30, ignore_eos=True)
    done = wait_ended(store, job["id"])

    events = [e for e in EventStream(live_server, job["id"]) if "event" in e]  # ends by itself

    assert events[0]["event"] == "started"
    assert events[-1]["event"] == "completed"
    assert events[-1]["data"]["output"] == done["output"]
    tokens = [e for e in events if e["event"] == "token"]
    assert "".join(e["data"]["text"] for e in tokens) == done["output"]
    assert sum(e["data"]["n"] for e in tokens) == 30
    assert [e["id"] for e in events] == list(range(len(events)))


def test_reconnect_with_last_event_id_resumes_without_gap_or_duplicate(jobs, store, start_worker, live_server):
    start_worker()
    job = jobs.submit("resume", max_tokens=400, ignore_eos=True)

    first = EventStream(live_server, job["id"])
    before = [e for e in read_until(first, lambda e: e.get("event") == "token" and e["id"] >= 4) if "id" in e]
    first.close()
    after = [e for e in EventStream(live_server, job["id"], last_event_id=before[-1]["id"]) if "id" in e]

    ids = [e["id"] for e in before + after]
    assert ids == list(range(len(ids)))
    assert after[-1]["event"] == "completed"
    text = "".join(e["data"]["text"] for e in before + after if e["event"] == "token")
    assert text == after[-1]["data"]["output"]
    assert after[-1]["data"]["usage"]["completion_tokens"] == 400


def test_pings_keep_a_waiting_stream_alive(jobs, live_server):
    job = jobs.submit("nobody runs me", max_tokens=4)  # no worker: it waits

    stream = EventStream(live_server, job["id"])
    seen: list[dict] = []
    pings = 0
    for item in stream:
        seen.append(item)
        pings += item.get("comment") == "ping"
        if pings == 2:
            break
    stream.close()

    assert seen[0]["event"] == "queued" and seen[0]["data"]["position"] == 1
    assert seen[1:] == [{"comment": "ping"}, {"comment": "ping"}]


def test_position_counts_down_as_jobs_ahead_finish_and_each_change_is_pushed(jobs, store, start_worker, live_server):
    # Given a running job and three waiting jobs
    start_worker()
    running = jobs.submit("a", max_tokens=3000, ignore_eos=True)
    wait_event(store, running["id"], lambda e: e.type == "token")
    b = jobs.submit("b", max_tokens=3000, ignore_eos=True)
    c = jobs.submit("c", max_tokens=3000, ignore_eos=True)
    d = jobs.submit("d", max_tokens=3, ignore_eos=True)
    stream = EventStream(live_server, d["id"])
    items = iter(stream)
    positions = [next(e for e in items if e.get("event") == "queued")["data"]["position"]]

    # When each job ahead ends, the next one starts
    for ahead in (running, b, c):
        jobs.cancel(ahead["id"])
        # (the same place may be told again meanwhile, its ETA having moved)
        moved = (
            e
            for e in items
            if e.get("event") == "started" or (e.get("event") == "queued" and e["data"]["position"] != positions[-1])
        )
        event = next(moved)
        if event["event"] == "queued":
            positions.append(event["data"]["position"])

    # Then the stream was told 3 -> 2 -> 1, then started
    assert positions == [3, 2, 1]
    assert event["event"] == "started"
    rest = [e for e in items if "event" in e]
    assert rest[-1]["event"] == "completed"


def running_job_left_s(store, job_id: str) -> float:  # type: ignore[no-untyped-def]
    """What is left of a running job at its own token rate, as a client could work it out."""
    job = store.get(job_id)
    now = sum(x / 10**6 * (10**6 if i == 0 else 1) for i, x in enumerate(store.redis.time()))
    rate = job.usage.completion_tokens / (now - job.timings.first_token_at)
    return (job.spec.params.max_tokens - job.usage.completion_tokens) / rate


def measured_pace(store, timeout_s: float = 10.0) -> list[float]:  # type: ignore[no-untyped-def]
    """The default model's pace, once its worker reported it (with a lease renewal: there is no event to wait on)."""
    deadline = time.monotonic() + timeout_s
    while not (pace := store.redis.hget(keys.model(store.settings.model_name), "pace")):
        assert time.monotonic() < deadline, "the worker never reported its pace"
        time.sleep(0.05)
    return list(json.loads(pace))


def at_one_pace(store, running: list[str], read):  # type: ignore[no-untyped-def]
    """`read()` at one measured pace, between two counts of each running job's tokens: (pace, counts before, what
    was read, counts after). The worker reports its pace again at each lease renewal: read again if it did between."""

    def counts() -> list[int]:
        return [store.get(job_id).usage.completion_tokens for job_id in running]

    while True:
        pace, before = measured_pace(store), counts()
        value, after = read(), counts()
        if measured_pace(store) == pace:
            return pace, before, value, after


def test_eta_counts_the_running_jobs_tokens_left_at_the_measured_pace(jobs, store, start_worker):
    start_worker()
    running = jobs.submit("a", max_tokens=3000, ignore_eos=True)
    store.follow_live(store.get(running["id"]))  # followed as it runs (else its count is written once a second)
    # its pace is measured (and reported) once it has run a while
    wait_event(
        store,
        running["id"],
        lambda e: e.type == "token" and jobs.get(running["id"])["usage"]["completion_tokens"] >= 300,
    )
    second = jobs.submit("b", max_tokens=4, ignore_eos=True)
    third = jobs.submit("c", max_tokens=4, ignore_eos=True)

    pace, [before], etas, [after] = at_one_pace(
        store, [running["id"]], lambda: [jobs.get(j["id"])["eta_s"] for j in (second, third)]
    )
    jobs.cancel(running["id"])
    step_s, per_sequence_s, _, per_step = pace  # (per_step: tokens a sequence gets a step, keeping proposals)
    per_token = (step_s + per_sequence_s) / per_step

    # the long job ended: second runs next, then third (the worker claims the next job the moment one ends,
    # so reading third's position here would race with second's start)
    started = [wait_ended(store, j["id"])["timings"]["started_at"] for j in (second, third)]
    assert started[0] < started[1]
    # second runs when the long job's 3000 tokens are done, at the measured pace (the ETA is in ms)
    assert (3000 - after) * per_token - 0.001 <= etas[0] <= (3000 - before) * per_token + 0.001
    # third once second's 4 tokens are (and its prompt read: a token or so)
    assert etas[1] - etas[0] == pytest.approx(4 * per_token, abs=0.05 * etas[0])


def test_watched_job_whose_stream_closed_is_skipped_before_generation(jobs, store, start_worker, live_server):
    start_worker()
    busy = jobs.submit("busy", max_tokens=BUSY, ignore_eos=True)
    wait_event(store, busy["id"], lambda e: e.type == "token")
    watched = jobs.submit("watched", max_tokens=8, abandon_on_disconnect=True)
    unwatched = jobs.submit("fire and forget", max_tokens=8, ignore_eos=True)

    stream = EventStream(live_server, watched["id"])
    read_until(stream, lambda e: e.get("event") == "queued")
    stream.close()  # the page was closed

    gone = wait_ended(store, watched["id"])  # once its lease lapsed, while the busy job still runs
    assert jobs.get(busy["id"])["status"] == "in_progress"
    jobs.cancel(busy["id"])
    assert gone["status"] == "cancelled"
    assert gone["error"]["type"] == "client_gone"
    assert gone["usage"]["completion_tokens"] == 0 and gone["timings"]["started_at"] is None
    kept = wait_ended(store, unwatched["id"])
    assert kept["status"] == "completed" and kept["usage"]["completion_tokens"] == 8


def test_an_open_stream_keeps_a_watched_job_in_the_queue_past_the_grace(jobs, store, start_worker, live_server):
    start_worker()
    busy = jobs.submit("busy", max_tokens=BUSY, ignore_eos=True)
    wait_event(store, busy["id"], lambda e: e.type == "token")
    watched = jobs.submit("watched", max_tokens=6, ignore_eos=True, abandon_on_disconnect=True)
    stream = EventStream(live_server, watched["id"])
    items = iter(stream)

    # hold the stream open for three times the grace (1 s in tests) while the job waits
    pings_needed = int(3 * store.settings.watch_grace_s / min(store.settings.sse_ping_s, 1 / 3)) + 1
    pings = 0
    for item in items:
        pings += item.get("comment") == "ping"
        if pings >= pings_needed:
            break
    jobs.cancel(busy["id"])

    rest = [e for e in items if "event" in e]
    assert rest[-1]["event"] == "completed"
    assert rest[-1]["data"]["usage"]["completion_tokens"] == 6
    assert {e["event"] for e in rest} & TERMINAL == {"completed"}


def test_a_stream_opened_while_its_job_ran_keeps_it_queued_after_its_worker_hands_it_back(jobs, store, live_server):
    job = jobs.submit("watched", max_tokens=6, abandon_on_disconnect=True)
    assert store.for_worker("w").take_device() == "ok"  # this test plays the worker
    assert claim_now(store, "w").id == job["id"]
    stream = EventStream(live_server, job["id"])  # opened (or reopened) while the job runs
    items = iter(stream)
    assert next(e for e in items if "event" in e)["event"] == "started"

    store.for_worker("w").hand_back(job["id"])  # its worker died: back to the front, with a fresh watch lease of 1 s
    assert next(e for e in items if "event" in e)["event"] == "requeued"
    pings_needed = int(3 * store.settings.watch_grace_s / min(store.settings.sse_ping_s, 1 / 3)) + 1
    pings = 0
    for item in items:  # three graces, the stream open all along
        pings += item.get("comment") == "ping"
        if pings >= pings_needed:
            break
    store.upkeep.housekeep()  # what would end it, had the lease lapsed

    assert store.get(job["id"]).status.value == "queued"
    stream.close()


def test_every_open_stream_of_a_web_process_shares_one_redis_subscription(jobs, live_server, redis_client):
    waiting = [jobs.submit(f"waiting {n}", max_tokens=4)["id"] for n in range(3)]  # no worker: they wait
    before = len(redis_client.client_list(_type="pubsub"))
    streams = [EventStream(live_server, job_id) for job_id in waiting]
    for stream in streams:
        assert next(iter(stream))["event"] == "queued"  # each stream is open and subscribed

    assert len(redis_client.client_list(_type="pubsub")) == before + 1
    # and no stream subscribed on its own: the process's one subscription takes every job's channel
    assert redis_client.pubsub_numsub(*(keys.channel(job_id) for job_id in waiting)) == [
        (keys.channel(job_id), 0) for job_id in waiting
    ]
    for stream in streams:
        stream.close()


def test_a_stream_survives_losing_its_redis_subscription(jobs, store, start_worker, live_server, redis_client):
    job = jobs.submit("through a cut", max_tokens=30, ignore_eos=True)  # waits: no worker yet
    stream = EventStream(live_server, job["id"])
    items = iter(stream)
    assert next(items)  # the stream is open and subscribed

    redis_client.client_kill_filter(_type="pubsub")  # the web's subscription is cut...
    start_worker()  # ...and the job runs while it is down: its live events are lost to the web

    # (the job's log, each event with its index; a `queued` notice, sent when the queue ahead moves, has none)
    events = [e for e in items if "event" in e and e["event"] != "queued"]
    assert events[-1]["event"] == "completed"  # read back from the job's log once subscribed again
    assert [e["id"] for e in events] == list(range(len(events)))
    assert "".join(e["data"]["text"] for e in events if e["event"] == "token") == events[-1]["data"]["output"]


def test_one_position_lookup_serves_every_waiting_stream_when_the_queue_moves(jobs, app, live_server, monkeypatch):
    head = jobs.submit("head", max_tokens=4)  # no worker: all of them wait
    waiting = [jobs.submit(f"behind {n}", max_tokens=4)["id"] for n in range(3)]
    streams = [iter(EventStream(live_server, job_id)) for job_id in waiting]
    assert [next(s)["data"]["position"] for s in streams] == [2, 3, 4]

    store = app.extensions["onelane"].store
    lookups: list[tuple[str, ...]] = []
    run = store.scripts.run

    def counting_run(name: str, pipe: object = None, **args: object) -> object:
        if name == "position":
            lookups.append(tuple(map(str, args["ids"])))  # type: ignore[call-overload]
        return run(name, pipe, **args)

    monkeypatch.setattr(store.scripts, "run", counting_run)
    jobs.cancel(head["id"])

    assert [next(e for e in s if e.get("event") == "queued")["data"]["position"] for s in streams] == [1, 2, 3]
    # one look-up for all three; besides it, at most one of a stream's own (a stream just opened may look its
    # standing up once, late, on a loaded machine: seen once, for the first stream). A look-up per stream fails this
    together = [ids for ids in lookups if sorted(ids) == sorted(waiting)]
    assert len(together) == 1 and len(lookups) < len(waiting), lookups


def read_to_the_end(stream: EventStream, within_s: float = 3.0) -> list[dict]:
    """Every item until the server ends the stream; fails if it is still open after `within_s` (pings come every
    0.25 s in tests, so a stream that never ends is caught)."""
    deadline = time.monotonic() + within_s
    items = []
    for item in stream:
        assert time.monotonic() < deadline, f"the stream did not end within {within_s} s: {items}"
        items.append(item)
    stream.close()
    return items


def test_a_stream_resumed_at_an_ended_jobs_terminal_event_ends_at_once(jobs, store, start_worker, live_server):
    start_worker()
    job = jobs.submit("done", max_tokens=5, ignore_eos=True)
    wait_ended(store, job["id"])
    terminal = len(store.events(job["id"])) - 1

    assert read_to_the_end(EventStream(live_server, job["id"], last_event_id=terminal)) == []
    rest = read_to_the_end(EventStream(live_server, job["id"], last_event_id=terminal - 1))
    assert [e["id"] for e in rest] == [terminal] and rest[0]["event"] == "completed"


def test_a_stream_on_a_job_cancelled_while_waiting_replays_its_end_and_ends(jobs, store, live_server):
    job = jobs.submit("never runs", max_tokens=4)  # no worker: it waits
    jobs.cancel(job["id"])

    events = read_to_the_end(EventStream(live_server, job["id"]))
    assert [(e["id"], e["event"]) for e in events] == [(0, "cancelled")]
    assert read_to_the_end(EventStream(live_server, job["id"], last_event_id=0)) == []


def test_a_waiting_stream_ends_when_its_job_is_cancelled(jobs, live_server):
    job = jobs.submit("waits", max_tokens=4)
    stream = EventStream(live_server, job["id"])
    items = iter(stream)
    assert next(items)["event"] == "queued"

    jobs.cancel(job["id"])

    assert [e["event"] for e in items if "event" in e] == ["cancelled"]


BAD_IDS = ["99999999999999999999", "9" * 5000, "abc", "-1", "-5", "1.0", "1e3", "0x1", "\u0665", "1", "2"]


@pytest.mark.parametrize("raw", BAD_IDS, ids=lambda raw: raw[:24])
@pytest.mark.parametrize("where", ["header", "query"])
def test_an_id_that_is_not_one_of_the_jobs_events_is_a_400(jobs, store, live_server, raw, where):
    job = jobs.submit("never runs", max_tokens=4)
    jobs.cancel(job["id"])  # its log: one event, index 0

    url = f"{live_server}/v1/jobs/{job['id']}/events"
    if where == "header":
        response = requests.get(url, headers={"Last-Event-ID": raw.encode("utf-8")}, timeout=5)
    else:
        response = requests.get(url, params={"last_event_id": raw}, timeout=5)

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request"
    assert error["param"] == ("Last-Event-ID" if where == "header" else "last_event_id")


def test_an_empty_last_event_id_means_none(jobs, live_server):
    job = jobs.submit("never runs", max_tokens=4)
    jobs.cancel(job["id"])

    response = requests.get(f"{live_server}/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": ""}, timeout=5)

    assert response.status_code == 200 and "id: 0\nevent: cancelled" in response.text


def test_a_running_jobs_stream_resumes_from_any_id_it_sent(jobs, store, start_worker, live_server):
    start_worker()
    job = jobs.submit("resume", max_tokens=200, ignore_eos=True)
    wait_event(store, job["id"], lambda e: e.type == "token")

    events = [e for e in read_to_the_end(EventStream(live_server, job["id"], last_event_id=0), 30) if "id" in e]

    assert events[0]["id"] == 1 and events[-1]["event"] == "completed"


def test_an_unreadable_message_on_a_job_channel_does_not_silence_the_process_feeds(store, settings):
    from web.feed import Feed, Hub

    # Given a web process's hub, and a feed following a job that has no events yet
    hub = Hub(store, settings.effective_redis_url)
    feed = Feed(store, hub, "job_garbled")
    try:
        # When something unreadable is published on the job's channel, then a real event
        store.redis.publish(keys.channel("job_garbled"), "not json")
        store.redis.publish(keys.channel("job_garbled"), '{"i":0,"e":{"type":"started","queued_s":0.5}}')

        # Then the feed still gets the event: the hub read on
        deadline = time.monotonic() + 10
        while (event := feed.get(timeout_s=0.5)) is None and time.monotonic() < deadline:
            pass
        assert event is not None and event.type == "started" and event.queued_s == 0.5
    finally:
        feed.close()


def test_a_hub_nobody_follows_lets_go_of_its_subscription_and_the_next_stream_subscribes_again(
    store, settings, monkeypatch
):
    from web import feed as feeds

    # Given a web process's hub whose one stream closed, and a short idle time
    monkeypatch.setattr(feeds, "IDLE_S", 0.2)
    hub = feeds.Hub(store, settings.effective_redis_url)
    first = feeds.Feed(store, hub, "job_first")
    reader = hub._reader
    assert reader is not None and hub._pubsub.connection is not None
    first.close()

    # Then its reader ends and its subscription goes: no thread, no connection, for a process nobody follows
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert hub._reader is None and hub._pubsub.connection is None

    # and the next stream subscribes again and gets its job's events
    second = feeds.Feed(store, hub, "job_second")
    try:
        store.redis.publish(keys.channel("job_second"), '{"i":0,"e":{"type":"started","queued_s":0.5}}')
        deadline = time.monotonic() + 10
        while (event := second.get(timeout_s=0.5)) is None and time.monotonic() < deadline:
            pass
        assert event is not None and event.type == "started"
    finally:
        second.close()
