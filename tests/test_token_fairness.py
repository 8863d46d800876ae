"""Fair in what the device spends (issue 51): a flow is charged in token units, its prompt's tokens read and its
answer's generated (each at its weight: the output weight, by default, as the device measured it): its prompt as
it is admitted, its answer's tokens as they are generated, what it used settled as it ends. So a user of long
prompts and long answers takes fewer turns than one of short questions, and a job is charged only what it used.
The queue runs in start-tag order: a flow's next job waits for what its last ones cost, its first job for nothing."""

from __future__ import annotations

import json

import pytest

from tasks import keys
from tasks.job import JobStatus
from tasks.store.worker import BatchReport
from tests.helpers import claim_now

USERS = [{"name": "alice", "key": "ka" * 8}, {"name": "bob", "key": "kb" * 8}, {"name": "carol", "key": "kc" * 8}]
LONG = " queue" * 2000  # 2,000 tokens, as the demo model's tokenizer counts them


@pytest.fixture
def settings(settings):  # type: ignore[no-untyped-def]
    users = settings.model_validate({"users": [*USERS[:2], {**USERS[2], "weight": 2}]}).users
    return settings.model_copy(update={"users": users, "max_queue": 100, "max_queued_per_user": 50})


def auth(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {('k' + user[0]) * 8}"}


def submit(client, user: str, prompt: str, max_tokens: int, ignore_eos: bool = True) -> str:  # type: ignore[no-untyped-def]
    reply = client.post(
        "/v1/jobs",
        json={"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": ignore_eos},
        headers=auth(user),
    )
    assert reply.status_code == 202, reply.get_json()
    return reply.get_json()["id"]


def order(store) -> list[str]:  # type: ignore[no-untyped-def]
    return store.redis.zrange(keys.QUEUE, 0, -1)


def test_a_user_of_long_prompts_and_answers_takes_fewer_turns_than_one_of_short_questions(jobs, store):
    # Given alice's jobs of 2,000-token prompts and 512-token answers, then bob's short questions
    long = [submit(jobs.client, "alice", LONG, 512) for _ in range(3)]
    short = [submit(jobs.client, "bob", f"question {n}?", 64) for n in range(40)]
    # Then alice's first runs first (nobody has been served yet), her next after as many of bob's as fit in her
    # first's prompt (2,000 token units: all 40 of bob's prompts of 16)
    queue = order(store)
    assert queue.index(long[0]) == 0 and queue.index(long[1]) == 41
    assert [j for j in queue if j in long] == long and [j for j in queue if j in short] == short

    # When her first starts: it is charged at once the answer it will write (512 tokens, EOS ignored, at 4 units)
    tag = lambda j: int(store.redis.hget(keys.job(j), "tag"))  # noqa: E731
    cost = lambda j: int(store.redis.hget(keys.job(j), "cost"))  # noqa: E731
    counted = int(store.redis.hget(keys.job(long[0]), "counted"))  # (its prompt's tokens, as the web counted them)
    prompt = -(-counted // 16) * 16  # (charged in steps of 16 tokens)
    before = tag(long[1])
    assert store.for_worker("w1").take_device() == "ok" and claim_now(store, "w1").id == long[0]
    # Then her next jobs moved back by its whole answer's cost, behind bob's, before a token of it came
    assert tag(long[1]) == before + 4 * 512
    assert cost(long[0]) == prompt + 4 * 512
    # And as it writes them, nothing more is charged
    writer = store.for_worker("w1")
    writer.append(long[0], (7,) * 512, "x" * 512, counted, start=(0, 0))
    assert tag(long[1]) == before + 4 * 512 and cost(long[0]) == prompt + 4 * 512
    assert tag(long[2]) - tag(long[1]) == prompt  # (her waiting one's prompt: its answer, as it starts)


def test_equal_jobs_still_take_turns_and_a_weight_of_2_takes_two_for_one(jobs, store):
    a = [submit(jobs.client, "alice", "the same question", 32) for _ in range(4)]
    b = [submit(jobs.client, "bob", "the same question", 32) for _ in range(4)]
    c = [submit(jobs.client, "carol", "the same question", 32) for _ in range(8)]
    owner = {**dict.fromkeys(a, "a"), **dict.fromkeys(b, "b"), **dict.fromkeys(c, "c")}
    # (each is charged 16 token units for its prompt as it is admitted; carol's, of weight 2, half that: ties keep
    # admission order)
    assert "".join(owner[j] for j in order(store)) == "abcc" * 4  # (charged their prompts' 16 units each, for now)


def test_a_job_is_charged_what_it_used_and_its_flows_waiting_jobs_move_by_the_difference(jobs, store):
    # Given alice's three jobs that may write 512 tokens each, and no answer of the model ended yet to expect less
    long = [submit(jobs.client, "alice", "tell me a story", 512, ignore_eos=False) for _ in range(3)]
    tag = lambda j: int(store.redis.hget(keys.job(j), "tag"))  # noqa: E731
    before = tag(long[1])
    # When the first starts, it is charged all it may write: 4 x 512 units
    assert store.for_worker("w1").take_device() == "ok"
    started = claim_now(store, "w1")
    assert started is not None and started.id == long[0]
    assert tag(long[1]) == before + 4 * 512
    short = [submit(jobs.client, "bob", f"question {n}?", 64) for n in range(16)]

    # When it ends having written 40 tokens and read a prompt of 20 (a short story: EOS came early)
    worker = store.for_worker("w1")
    worker.append(long[0], (7,) * 40, "x" * 40, 20, start=(0, 0))
    assert tag(long[1]) == before + 4 * 512  # (within what it was charged as it started)
    assert worker.finish(long[0], JobStatus.COMPLETED, finish_reason="stop", prompt_tokens=20, completion_tokens=40)

    # Then it was charged 32 + 4 x 40 units (its 20 prompt tokens count as 2 steps of 16), and her next job moved by
    # what it was charged in all, less its prompt's estimate of 16, which it had been placed behind
    assert int(store.redis.hget(keys.job(long[0]), "cost")) == 32 + 4 * 40
    assert tag(long[1]) == before + (32 + 4 * 40) - 16
    after = order(store)
    assert [j for j in after if j in short] == short  # bob's own order is his
    # And the flow's service is counted in token units, for /metrics
    assert store.redis.zscore(keys.SERVICE, "alice") == 32 + 4 * 40
    metrics = jobs.client.get("/metrics").get_data(as_text=True)
    assert 'onelane_flow_service_tokens_total{flow="alice"} 192.0' in metrics


def test_an_answer_longer_than_expected_is_charged_as_it_comes(jobs, store):
    # Given a model whose answers ended at 40 tokens (the median of its recent answers is what a new one expects)
    writer = store.for_worker("w1")
    assert writer.take_device() == "ok"
    first = submit(jobs.client, "alice", "tell me a story", 512, ignore_eos=False)
    assert claim_now(store, "w1").id == first
    writer.append(first, (7,) * 40, "x" * 40, 4, start=(0, 0))
    assert writer.finish(first, JobStatus.COMPLETED, finish_reason="stop", prompt_tokens=4, completion_tokens=40)
    # When alice's next starts, it is charged the 40 tokens expected
    second, third = (submit(jobs.client, "alice", "tell me more", 512, ignore_eos=False) for _ in range(2))
    tag = lambda j: int(store.redis.hget(keys.job(j), "tag"))  # noqa: E731
    before = tag(third)
    assert claim_now(store, "w1").id == second
    assert tag(third) == before + 4 * 40
    # And when it runs past them, what it writes beyond is charged as it comes, 32 tokens at a time
    writer.append(second, (7,) * 71, "x" * 71, 4, start=(0, 0))
    assert tag(third) == before + 4 * 40  # (31 past: not yet)
    writer.append(second, (7,), "x", 4, start=(71, 71))
    assert tag(third) == before + 4 * 72


def test_a_job_that_never_ran_is_charged_nothing(jobs, store):
    # Given alice's long job ahead of her short one, and bob's questions
    first = submit(jobs.client, "alice", LONG, 512)
    second = submit(jobs.client, "alice", "short?", 8)
    for n in range(8):
        submit(jobs.client, "bob", f"question {n}?", 8)
    assert order(store).index(second) == 9  # (behind the first's prompt: 2,000 units, all 8 of bob's)
    # When the long one is cancelled before it starts
    assert jobs.client.delete(f"/v1/jobs/{first}", headers=auth("alice")).status_code in (200, 202)
    # Then nothing is charged for it, and her next job moves up as if it had never been sent
    assert store.redis.zscore(keys.SERVICE, "alice") is None
    assert order(store).index(second) == 0


def test_the_output_weight_auto_is_what_a_token_cost_the_device_as_its_worker_measured_it(jobs, store):
    # Given two jobs admitted before the model's pace is known
    first, second = (submit(jobs.client, "alice", "a question", 100) for _ in range(2))
    cost = lambda job_id: int(store.redis.hget(keys.job(job_id), "cost"))  # noqa: E731
    charged = {j: cost(j) for j in (first, second)}
    # When the first starts: a generated token is charged 4 prompt tokens, for want of a measure
    assert store.for_worker("w1").take_device() == "ok" and claim_now(store, "w1").id == first
    assert cost(first) - charged[first] == 4 * 100
    # When a worker with a batch of 8 reports the model's pace: a step's fixed cost 80 ms, 10 ms a sequence, 2 ms a
    # prompt token (so a token of a full batch costs 10 + 80 / 8 = 20 ms: 10 prompt tokens' time)
    pace = json.dumps({store.settings.model_name: [0.08, 0.01, 0.002]})
    report = BatchReport(
        batch=8, slots=8, tokens_per_s=1.0, steps=1, decode_s=0, prefill_s=0, prefill_tokens=0, pace=pace
    )
    assert store.for_worker("w1").renew_device(report) == "ok"
    # Then the second, though admitted before, is charged at 10 a token as it starts: the pace measured now
    assert claim_now(store, "w1").id == second
    assert cost(second) - charged[second] == 10 * 100
    # And the first is settled at 10 as it ends (its 4 prompt tokens count as a step of 16)
    writer = store.for_worker("w1")
    writer.append(first, (7,) * 100, "x" * 100, 4, start=(0, 0))
    assert writer.finish(first, JobStatus.COMPLETED, finish_reason="length", prompt_tokens=4, completion_tokens=100)
    assert cost(first) == 16 + 10 * 100
    # And /metrics tells what a token costs now
    metrics = jobs.client.get("/metrics").get_data(as_text=True)
    assert f'onelane_model_token_cost{{model="{store.settings.model_name}"}} 10.0' in metrics


def test_a_job_handed_back_and_then_cancelled_is_charged_what_it_used_once(jobs, store):
    # Given alice's job that ran 40 tokens of a 20-token prompt (charged the 512 it asked for as it started), then
    # went back to the queue, and her next job behind it
    first = submit(jobs.client, "alice", "tell me a story", 512)
    writer = store.for_worker("w1")
    assert writer.take_device() == "ok" and claim_now(store, "w1").id == first
    writer.append(first, (7,) * 40, "x" * 40, 20, start=(0, 0))
    assert writer.hand_back(first, "worker_crashed")
    second = submit(jobs.client, "alice", "tell me another", 512)
    tag = int(store.redis.hget(keys.job(second), "tag"))
    # When the first is cancelled while it waits
    assert jobs.client.delete(f"/v1/jobs/{first}", headers=auth("alice")).status_code in (200, 202)
    # Then it is charged what it used, once: 32 + 4 x 40 units, where it had been charged 16 + 4 x 512
    assert store.redis.zscore(keys.SERVICE, "alice") == 32 + 4 * 40
    assert int(store.redis.hget(keys.job(second), "tag")) == tag + (32 + 4 * 40) - (16 + 4 * 512)


@pytest.mark.parametrize("weights", [(2, 1), (1, 2), (1, 1)])
def test_users_share_a_simulated_device_by_their_weights(settings, make_app, weights):
    # Given a user of 2,000-token prompts and 512-token answers and one of 64-token questions and 64-token answers,
    # 16 clients each, closed-loop, on a simulated device of 4 slots (SmolLM2-135M's pace on 2 cores) that the real
    # admission and worker scripts run (bench/fair_order.py)
    from bench.fair_order import Load, Served, ratio_of, simulate, users_of

    users = settings.model_validate({"users": users_of(weights)}).users
    s = settings.model_copy(
        update={
            "users": users,
            "max_batch": 4,
            "max_queue": 1000,
            "max_queued_per_user": 1000,
            "max_tokens_limit": 4096,
        }
    )
    pace, ratios = (0.074, 0.009, 0.0035), []

    def mark(clock: float, served: dict[str, Served]) -> None:
        if clock >= 30 * (len(ratios) + 1):  # (every 30 s)
            ratios.append(ratio_of(served, pace, 4, weights))

    # When they run for 5 simulated minutes
    served = simulate(s, make_app(s).test_client(), Load({"long": (2000, 512), "short": (64, 64)}), pace, 300, mark)
    # Then from the third minute on, their device-seconds stand within 10 % of their weights' ratio, and at the end
    # within 5 %
    assert len(ratios) == 10 and all(abs(r - 1) <= 0.10 for r in ratios[5:]), ratios
    assert abs(ratio_of(served, pace, 4, weights) - 1) <= 0.05, ratios
