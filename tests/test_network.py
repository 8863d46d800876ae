"""A worker cut off from Redis for less than its lease (a network blip, a proxy that stops forwarding, a failover)
ends no job it did not finish, invents no outcome, and loses or doubles no output: what it could not write goes out
once Redis answers again, and the job completes as if nothing happened."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tasks import keys
from tests.helpers import claim_now, wait_ended, wait_event
from tests.netproxy import Proxy

REDIS_TIMEOUT_S = 1.5  # the worker's: short, but not so short that a loaded machine's own delays trip it
BLIP_S = 4.0  # longer than the worker's Redis timeout, shorter than its lease (20 s)
GREEDY = {"max_tokens": 4000, "ignore_eos": True, "temperature": 0}  # ~3 s of work alone, more on a loaded machine


@pytest.fixture
def proxy(redis_server) -> Iterator[Proxy]:  # type: ignore[no-untyped-def]
    """Requested before the worker, so it outlives it: the worker stops in good order through it."""
    proxy = Proxy(("127.0.0.1", redis_server.port))
    yield proxy
    proxy.close()


@pytest.mark.parametrize("cut", ["blackhole", "reset"])
def test_a_worker_cut_off_from_redis_for_less_than_its_lease_loses_nothing(cut, proxy, jobs, store, start_worker):
    start_worker(redis_url=proxy.url, lease_s=20, redis_timeout_s=REDIS_TIMEOUT_S)
    alone = wait_ended(store, jobs.submit("the same words", **GREEDY)["id"], timeout_s=90)  # nothing cut
    job = jobs.submit("the same words", **GREEDY)
    wait_event(store, job["id"], lambda e: e.type == "token")

    getattr(proxy, cut)()
    threading.Event().wait(BLIP_S)  # the outage itself: the worker generates on, alone
    proxy.heal()

    done = wait_ended(store, job["id"], timeout_s=90)
    assert (done["status"], done["finish_reason"], done["attempts"]) == ("completed", "length", 1)
    assert done["usage"]["completion_tokens"] == GREEDY["max_tokens"]
    assert done["output"] == alone["output"]  # nothing lost, nothing doubled
    logged = "".join(e.text for e in store.events(job["id"]) if e.type == "token")
    assert logged == done["output"]  # and the event log, which streams replay, holds it exactly once
    assert [e.type for e in store.events(job["id"])].count("requeued") == 0


def test_a_write_sent_again_or_arriving_late_appends_each_piece_once(store):
    """What reaches Redis when replies are lost: the same write twice, a retry that carries more, and stale copies
    arriving after later writes, or before their predecessors."""
    from tasks.job import JobSpec, SamplingParams

    spec = JobSpec(owner="o", model=store.settings.model_name, prompt="p", params=SamplingParams(max_tokens=9))
    store.admit("job_w", spec, 60)
    assert store.for_worker("w").take_device() == "ok" and claim_now(store, "w").id == "job_w"

    def write(text: str, n: int, start: tuple[int, int]) -> int:  # (token i's id is i)
        ids = tuple(range(start[0], start[0] + n))
        return int(store.for_worker("w").append("job_w", ids, text, 1, start=start))

    assert write("ab", 2, (0, 0)) == 0
    assert write("ab", 2, (0, 0)) == 0  # the same write again (its reply was lost): nothing more
    assert write("abcd", 4, (0, 0)) == 0  # a retry that carries more: only the more
    assert write("e", 1, (5, 5)) == 2  # ahead of its predecessor: nothing (the writer sends it again, in order)
    assert write("ab", 2, (0, 0)) == 0  # a stale copy behind it all: nothing, and no reason to stop
    assert write("é", 1, (4, 4)) == 0  # a piece of two bytes
    assert write("e", 1, (5, 6)) == 0

    job = store.get("job_w")
    assert (job.output, job.usage.completion_tokens) == ("abcdée", 6)
    assert [e.text for e in store.events("job_w") if e.type == "token"] == ["ab", "cd", "é", "e"]
    assert store.redis.get(keys.tokens("job_w")) == "0,1,2,3,4,5,"  # each token's id once, in order


def test_a_claim_whose_answer_is_lost_gets_the_job_it_started_when_sent_again(proxy, store, settings):
    """The claim reached Redis and started a job; its answer did not reach the worker (the connection died, Redis
    restarted). Sent again, it is answered with that job: else the job would stay in progress, run by nobody, for
    as long as its worker holds the device."""
    import redis

    from tasks.job import JobSpec, SamplingParams
    from tasks.store import Store

    for job_id in ("job_first", "job_second"):
        spec = JobSpec(owner="o", model=settings.model_name, prompt="p", params=SamplingParams(max_tokens=9))
        store.admit(job_id, spec, 60)
    worker = Store.connect(settings.model_copy(update={"redis_url": proxy.url, "redis_timeout_s": 0.5}))
    mine = worker.for_worker("w")
    assert mine.take_device() == "ok"
    worker.load_scripts()  # (in Redis already: the claim's answer is lost, not a NOSCRIPT)

    proxy.mute()  # Redis hears the claim; its answer is lost
    with pytest.raises(redis.RedisError):
        mine.claim_next(want="*")
    assert store.get("job_first").status.value == "in_progress"
    proxy.heal()
    again = mine.claim_next(want="*")

    assert again is not None and again.started and again.job.id == "job_first"
    assert store.get("job_second").status.value == "queued"  # not a second job in its place
    assert [e.type for e in store.events("job_first")].count("started") == 1
    then = mine.claim_next(want="*")  # the next claim, answered, is a new one
    assert then is not None and then.job.id == "job_second"
    worker.redis.close()
