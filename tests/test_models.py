"""Several models behind one queue, two priority classes and weighted users: one worker owns the device for every
model, loads them on demand within a memory budget, and schedules across them without starving anyone."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from bench.harness import generate
from tasks import keys
from tasks.catalogue import ModelConfig
from tasks.eta import Rules, forecast
from tasks.job import JobSpec, JobStatus, SamplingParams
from tasks.scheduling import LOOK_AHEAD
from tasks.settings import Settings
from tasks.store import BatchReport, Claim, Store, Switch
from tasks.users import User
from tests.helpers import wait_ended
from tests.test_eta import BATCH, snapshot


@pytest.fixture(scope="session")
def mini_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from worker.demo_build.model import make_demo_model

    return make_demo_model(tmp_path_factory.mktemp("models") / "mini", size="mini")


@pytest.fixture(scope="session")
def broken_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder that mlx_lm.load refuses: a config, no weights."""
    folder = tmp_path_factory.mktemp("models") / "broken"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    return folder


@pytest.fixture
def served(settings: Settings, demo_model: Path, mini_model: Path, broken_model: Path) -> Settings:
    """tiny (the default), mini (about six times its size) and broken."""
    catalog = (
        ModelConfig(name="tiny", path=str(demo_model), default=True),
        ModelConfig(name="mini", path=str(mini_model)),
        ModelConfig(name="broken", path=str(broken_model)),
    )
    return settings.model_copy(update={"model": None, "models": catalog, "max_batch": 4})


def admit(store: Store, owner: str, model: str, n: int = 0, tokens: int = 12, ring=None, **spec: object) -> str:  # type: ignore[no-untyped-def]
    """Admit a job as the web does; with the doorbell of the worker `ring` (a worker started later finds the jobs
    waiting at its start)."""
    from tasks.broker import Doorbell

    job_id = f"job_{owner}_{model}_{n}_{time.monotonic_ns()}"
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    doorbell = Doorbell.ring(ring.broker, job_id) if ring else None
    store.admit(
        job_id,
        JobSpec(owner=owner, model=model, prompt=f"{owner} {n}", params=params, **spec),
        120,  # type: ignore[arg-type]
        doorbell=doorbell,
    )
    return job_id


def run_order(store: Store, ids: list[str]) -> list[str]:
    done = {job_id: wait_ended(store, job_id, timeout_s=60) for job_id in ids}
    assert all(d["status"] == "completed" for d in done.values()), done
    return sorted(ids, key=lambda job_id: done[job_id]["timings"]["started_at"])


def alone(path: Path, prompt: str, tokens: int) -> str:
    from worker.batch.engine import Engine

    spec = JobSpec(owner="t", model="x", prompt=prompt, params=SamplingParams(max_tokens=tokens, ignore_eos=True))
    return "".join(chunk.text for chunk in generate(Engine.load(str(path)), spec))


# --- routing, memory, failures ---------------------------------------------------------------------------------


def test_each_job_runs_on_the_model_it_names(served, start_worker, mini_model, demo_model):
    worker = start_worker(served)
    store = worker.store
    ids = {model: admit(store, "u", model, tokens=16, ring=worker) for model in ("mini", "tiny")}

    outputs = {model: wait_ended(store, job_id)["output"] for model, job_id in ids.items()}

    assert outputs["mini"] == alone(mini_model, "u 0", 16)
    assert outputs["tiny"] == alone(demo_model, "u 0", 16)
    assert outputs["mini"] != outputs["tiny"]
    states = {m.name: m.state for m in store.readings.snapshot().models}
    assert states == {"tiny": "loaded", "mini": "loaded", "broken": "unloaded"}


def test_a_budget_that_holds_one_model_evicts_the_least_recently_used(served, start_worker, demo_model, mini_model):
    tiny, mini = (sum(f.stat().st_size for f in p.glob("*.safetensors")) for p in (demo_model, mini_model))
    # either fits alone, both do not; no job may go ahead of another model's (a switch at every change of model)
    budget = served.model_copy(update={"models_memory": mini + tiny // 2, "model_switch_wait_s": 0})
    worker = start_worker(budget)
    store, held = worker.store, []
    load = worker.models.load

    def watched_load(name: str):  # type: ignore[no-untyped-def]
        engine = load(name)
        held.append(worker.models.names())
        return engine

    worker.models.load = watched_load  # type: ignore[method-assign]
    ids = [admit(store, "u", model, n, ring=worker) for n, model in enumerate(["mini", "tiny", "mini", "tiny"])]

    assert [d["status"] for d in map(lambda i: wait_ended(store, i), ids)] == ["completed"] * 4
    assert held and all(len(names) == 1 for names in held), held
    assert worker.models.held_bytes <= budget.models_memory
    assert store.redis.hget(keys.model("tiny"), "state") in ("loaded", "unloaded")
    assert len(held) == 4  # it switched at every job, loading again what it had evicted


def test_a_model_that_fails_to_load_fails_its_own_jobs_only(served, store, start_worker, make_app):
    store = Store(store.redis, served)
    broken = [admit(store, "u", "broken", n) for n in range(3)]
    fine = admit(store, "v", "tiny")
    start_worker(served)  # finds them waiting

    for job_id in broken:
        done = wait_ended(store, job_id)
        assert done["status"] == "failed" and done["error"]["type"] == "model_unavailable"
        assert "/" not in done["error"]["message"]  # no server path reaches a client
    assert wait_ended(store, fine)["status"] == "completed"

    client = make_app(served).test_client()
    refused = client.post("/v1/jobs", json={"prompt": "x", "model": "broken"})
    assert refused.status_code == 503 and int(refused.headers["Retry-After"]) <= served.model_retry_s
    assert client.post("/v1/jobs", json={"prompt": "x", "model": "mini"}).status_code == 202
    ready = client.get("/readyz").get_json()
    assert {m["name"]: m["state"] for m in ready["models"]}["broken"] == "failed"


@pytest.mark.parametrize(
    "kind,files,said",
    [
        ("embedding", {"modules.json": [{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
                                        {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]},
         "is an embedding model: it generates no text"),
        ("reranker", {"config.json": {"architectures": ["Qwen3ForSequenceClassification"]}},
         "mlx-vlm cannot load it as a reranker"),
    ],
)  # fmt: skip
def test_a_job_asking_an_embedding_model_or_a_reranker_for_text_fails_in_words_never_generated(
    kind, files, said, served, store, start_worker, demo_model, tmp_path
):
    # Given a folder mlx_lm.load would load as the causal model it is built on, that says what it is in its files
    folder = tmp_path / kind
    shutil.copytree(demo_model, folder)
    for name, content in files.items():
        old = json.loads((folder / name).read_text()) if (folder / name).exists() else {}
        (folder / name).write_text(json.dumps({**old, **content} if isinstance(content, dict) else content))
    catalog = (*served.catalog, ModelConfig(name=kind, path=str(folder)))
    served = served.model_copy(update={"models": catalog})
    store = Store(store.redis, served)
    # When a job asks for it
    job_id = admit(store, "u", kind)
    start_worker(served)
    # (admitted under an older models file, say: the web routes each kind to its endpoints)
    # Then the job fails model_unavailable, saying what the model is, or why it cannot be loaded as that
    done = wait_ended(store, job_id)
    assert (done["status"], done["error"]["type"]) == ("failed", "model_unavailable")
    assert said in done["error"]["message"], done["error"]["message"]


def test_only_one_thread_ever_steps_and_no_two_steps_overlap(served, start_worker, monkeypatch):
    from worker.batch.engine import Engine

    spans: list[tuple[float, float, int, str]] = []
    step = Engine.step

    def timed_step(self):  # type: ignore[no-untyped-def]
        began = time.perf_counter()
        try:
            return step(self)
        finally:
            spans.append((began, time.perf_counter(), threading.get_ident(), self.name))

    monkeypatch.setattr(Engine, "step", timed_step)
    worker = start_worker(served)
    store = worker.store
    ids = [admit(store, f"u{n % 3}", ("tiny", "mini")[n % 2], n, tokens=24, ring=worker) for n in range(12)]

    run_order(store, ids)

    assert {name for *_, name in spans} == {"tiny", "mini"}
    assert len({thread for _, _, thread, _ in spans}) == 1
    spans.sort()
    assert all(end <= next_began for (_, end, *_), (next_began, *_) in zip(spans, spans[1:]))


# --- scheduling across models ------------------------------------------------------------------------------------


def test_a_loaded_models_jobs_go_ahead_of_the_head_only_within_the_switch_wait(served, store):
    patient = Store(store.redis, served.model_copy(update={"model_switch_wait_s": 600}))
    strict = Store(store.redis, served.model_copy(update={"model_switch_wait_s": 0}))
    patient.for_worker("w").take_device()
    head = admit(patient, "a", "mini")
    behind = admit(patient, "b", "tiny")

    switch = strict.for_worker("w").claim_next(want="*", active="tiny", loaded=("tiny",))
    assert switch == Switch(head, "mini", load=False)  # strict: the batch drains, then mini runs
    ahead = patient.for_worker("w").claim_next(want="*", active="tiny", loaded=("tiny",))
    assert not isinstance(ahead, Switch) and ahead.job.id == behind  # within the bound: tiny goes ahead
    assert patient.for_worker("w").claim_next(want="*", active="", loaded=("tiny",)) == Switch(head, "mini", load=True)
    assert patient.for_worker("w").claim_next(want="*", active="", loaded=("tiny", "mini")).job.id == head  # type: ignore[union-attr]


def test_the_claim_and_the_eta_agree_how_far_a_job_may_go_ahead_of_the_head(served, store):
    patient = Store(store.redis, served.model_copy(update={"model_switch_wait_s": 600, "max_queue": 1000}))
    worker = patient.for_worker("w")
    worker.take_device()

    # Given a head of mini with LOOK_AHEAD more mini jobs behind it, then a tiny job, while tiny runs
    for n in range(LOOK_AHEAD + 1):
        admit(patient, f"m{n}", "mini")
    tiny = admit(patient, "t", "tiny")
    # Then the tiny job goes ahead of the head, wherever it stands (the batch's model's own queue)
    claim = worker.claim_next(active="tiny", loaded=("tiny",))
    assert isinstance(claim, Claim) and claim.job.id == tiny
    # and the ETA plays it so
    running = [{"max_tokens": 20}]
    waiting = [{"model": "other"}] * (LOOK_AHEAD + 1) + [{}]
    assert forecast(snapshot(running=running, waiting=waiting, slots=4), Rules(4, 65536, 600))[-1] == pytest.approx(0)

    # Given a full batch holding batch-class work, an interactive job takes a batch job's slot only from within
    # LOOK_AHEAD places of the fair order, in the ETA's play as in claim.lua (which reads the same constant)
    def starts(place: int) -> float:
        held = [{"max_tokens": 20, **BATCH}]
        waiting = [BATCH] * (place - 1) + [{}]
        return forecast(snapshot(running=held, waiting=waiting), Rules(1, 65536, 600, preempt_limit=1))[-1]

    assert starts(LOOK_AHEAD) == pytest.approx(0.0, abs=0.01)
    assert starts(LOOK_AHEAD + 1) > 1.0


def test_a_head_job_passed_over_waits_no_longer_than_the_bound(served, store):
    bounded = Store(store.redis, served.model_copy(update={"model_switch_wait_s": 0.2}))
    bounded.for_worker("w").take_device()
    head = admit(bounded, "a", "mini")
    passed = []
    began = time.monotonic()
    while True:  # an endless supply of tiny jobs behind it
        admit(bounded, "b", "tiny")
        claim = bounded.for_worker("w").claim_next(want="*", active="tiny", loaded=("tiny",))
        if isinstance(claim, Switch):
            break
        passed.append(claim)
        bounded.for_worker("w").finish(claim.job.id, JobStatus.COMPLETED)  # type: ignore[union-attr]
    waited = time.monotonic() - began

    assert claim.head == head and passed
    assert 0.2 <= waited < 2


@pytest.mark.parametrize("switch_wait", [0, 5])
def test_a_newcomer_waits_behind_at_most_one_job_of_each_user_whether_or_not_heads_are_passed_over(
    switch_wait, served, store
):
    s = Store(store.redis, served.model_copy(update={"model_switch_wait_s": switch_wait}))
    s.for_worker("w").take_device()
    alice = [admit(s, "alice", "mini", n) for n in range(6)]
    bob = [admit(s, "bob", "tiny", n) for n in range(6)]
    # four jobs start: with the switch wait, bob's go ahead of alice's head (the batch runs tiny); without, the
    # worker switches at every change of model and they start in fair order
    started = [
        s.for_worker("w").claim_next(want="*", active="tiny" if switch_wait else "", loaded=("tiny", "mini")).job.id  # type: ignore[union-attr]
        for _ in range(4)
    ]
    assert started == (bob[:4] if switch_wait else [alice[0], bob[0], alice[1], bob[1]])

    carol = admit(s, "carol", "mini")
    queue = s.redis.zrange(keys.QUEUE, 0, -1)
    ahead = queue[: queue.index(carol)]
    assert len([j for j in ahead if j in alice]) <= 1 and len([j for j in ahead if j in bob]) <= 1
    # (with the switch wait, alice's head was passed over: it keeps its place ahead of the newcomer)
    assert (alice[0] in ahead) == bool(switch_wait)
    # and bob's jobs that went ahead were his turns: his next one waits behind alice's
    assert queue.index(bob[4]) > queue.index(alice[4])


# --- classes and weights --------------------------------------------------------------------------------------


def test_batch_work_waits_for_interactive_work_but_is_not_starved(settings, store, start_worker):
    batch_cost = 4
    s = settings.model_copy(update={"batch_cost": batch_cost})
    fair = Store(store.redis, s)
    batch = [admit(fair, "night", s.model_name, n, priority="batch") for n in range(3)]
    interactive = [admit(fair, "day", s.model_name, n) for n in range(10)]
    start_worker(batch_cost=4, preempt_limit=0)  # (the share alone: a preempted job's start moves; test_preemption)

    order = run_order(fair, batch + interactive)

    # the first batch job runs after batch_cost interactive ones (it waits for its finish tag), then about one per
    # batch_cost turns (charged in tokens, as they used them: a job's tokens cost batch_cost times as much, give or
    # take a quantum)
    places = [order.index(b) for b in batch]
    assert places[0] == batch_cost and all(b - a <= batch_cost + 1 for a, b in zip(places, places[1:])), places


def test_a_user_of_weight_two_gets_two_turns_to_one(settings, store, start_worker):
    users = (User(name="heavy", key="kh", weight=2), User(name="light", key="kl"))
    s = settings.model_copy(update={"users": users})
    fair = Store(store.redis, s)
    light = [admit(fair, "light", s.model_name, n) for n in range(6)]
    heavy = [admit(fair, "heavy", s.model_name, n) for n in range(6)]
    start_worker(users=users)

    order = run_order(fair, light + heavy)

    owners = ["heavy" if job_id in heavy else "light" for job_id in order]
    assert owners[:9] == ["light", "heavy", "heavy"] * 3


def test_position_and_eta_count_a_pending_model_load(served, store):
    fair = Store(store.redis, served)
    worker = fair.for_worker("w")
    worker.take_device(BatchReport(batch=0, slots=4, tokens_per_s=0, steps=0, decode_s=0, prefill_s=0,
                                   prefill_tokens=0, models=("tiny",)))  # fmt: skip
    worker.model_loaded("mini", load_s=5.0, size=1)  # its last load took 5 s

    tiny, mini = (fair.admit(f"job_{m}", JobSpec(owner=m, model=m, prompt="x"), 60) for m in ("tiny", "mini"))
    waits_for_load = fair.standing(mini).eta_s
    worker.renew_device(BatchReport(batch=0, slots=4, tokens_per_s=0, steps=0, decode_s=0, prefill_s=0,
                                    prefill_tokens=0, models=("tiny", "mini")))  # fmt: skip

    assert (tiny.position, mini.position, tiny.eta_s) == (1, 2, 0.0)
    assert mini.eta_s == pytest.approx(waits_for_load)
    assert waits_for_load - fair.standing(mini).eta_s == pytest.approx(5.0)  # only the load sets them apart


def test_a_models_max_kv_size_bounds_what_each_job_holds_of_the_kv_budget(served, start_worker, demo_model):
    # about 205 tokens a job (prompt + 200): two never fit a budget of 300, but with its cache capped at 64 tokens a
    # job holds 64 of it, and four generate together
    capped = (ModelConfig(name="tiny", path=str(demo_model), default=True, max_kv_size=64),)
    worker = start_worker(served.model_copy(update={"models": capped, "max_batch": 8, "kv_budget_tokens": 300}))
    ids = [admit(worker.store, f"u{n}", "tiny", n, tokens=200, ring=worker) for n in range(6)]

    done = [wait_ended(worker.store, job_id) for job_id in ids]

    assert all(d["status"] == "completed" and d["usage"]["completion_tokens"] == 200 for d in done)
    spans = [(d["timings"]["started_at"], d["timings"]["finished_at"]) for d in done]
    together = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert together == 4
