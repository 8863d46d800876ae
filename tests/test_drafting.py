"""A draft model as the batch's source of proposals (worker/batch/drafting.py): a smaller model with the served
model's tokenizer proposes each row's greedy continuation, the served model checks it in the step's forward pass, and
the answers are those of a batch that proposes nothing, token for token; the draft's own KV cache follows each row."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from tasks import keys
from tasks.catalogue import DEMO_MODEL, SHIPPED_DEMO_MODEL, ModelConfig, read_models_file
from tasks.job import JobSpec, SamplingParams
from tasks.settings import Settings
from tests.helpers import wait_ended
from tests.test_hostile_models import serve
from tests.tiny_archs import TOKENIZER_FILES
from worker.batch.drafting import Draft, Drafter, load_drafter
from worker.batch.engine import Engine
from worker.batch.forward import ContinuousBatch
from worker.batch.proposers import Proposer
from worker.batch.sampling import make_sampler
from worker.batch.speculation import Speculation
from worker.unsupported import Unsupported

QUESTIONS = (
    "Tell me about the sea.",
    "What is a queue?",
    "Say hello to my friend Bob, please, and tell him a short joke about robots.",
    "Hi",
)
GREEDY = SamplingParams(temperature=0, max_tokens=48)


def tiny_llama(folder: Path, vocab: int = 2048, seed: int = 7) -> Path:
    """A random llama of two layers 32 wide over the demo model's tokenizer (as mlx-lm's tests build theirs)."""
    from mlx_lm.models import llama
    from mlx_lm.utils import save_config, save_model

    config = dict(
        model_type="llama", hidden_size=32, num_hidden_layers=2, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=vocab, max_position_embeddings=8192,
        tie_word_embeddings=True, eos_token_id=2,
    )  # fmt: skip
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    folder.mkdir(parents=True)
    save_model(folder, model)
    save_config(config, config_path=folder / "config.json")
    for name in TOKENIZER_FILES:
        shutil.copy(SHIPPED_DEMO_MODEL / name, folder / name)
    return folder


def shallow_demo(folder: Path, layers: int = 1) -> Path:
    """The demo model's first `layers` layers alone (its embeddings and head too): a draft whose proposals are often
    but not always what the whole model draws."""
    weights = mx.load(str(SHIPPED_DEMO_MODEL / "model.safetensors"))
    kept = {k: w for k, w in weights.items() if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    config = json.loads((SHIPPED_DEMO_MODEL / "config.json").read_text())
    folder.mkdir(parents=True)
    mx.save_safetensors(str(folder / "model.safetensors"), kept, metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
    for name in TOKENIZER_FILES:
        shutil.copy(SHIPPED_DEMO_MODEL / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def self_drafted() -> Engine:
    """The demo model, its own draft (every proposal the draft makes is what the model draws)."""
    return Engine.load(ModelConfig(name=DEMO_MODEL, path=str(SHIPPED_DEMO_MODEL), draft=str(SHIPPED_DEMO_MODEL)))


@pytest.fixture(scope="module")
def random_draft(self_drafted: Engine, tmp_path_factory: pytest.TempPathFactory) -> Drafter:
    """A tiny random model with the demo model's tokenizer, drafting for it: its proposals seldom kept."""
    folder = tiny_llama(tmp_path_factory.mktemp("drafts") / "tiny-draft")
    return load_drafter(str(folder), "auto", DEMO_MODEL, self_drafted.tokenizer)


@pytest.fixture(scope="module")
def shallow_draft(self_drafted: Engine, tmp_path_factory: pytest.TempPathFactory) -> Drafter:
    """The demo model's first layer alone, drafting for the whole model: about half its proposals kept."""
    folder = shallow_demo(tmp_path_factory.mktemp("drafts") / "shallow-draft")
    return load_drafter(str(folder), "auto", DEMO_MODEL, self_drafted.tokenizer)


@pytest.fixture(params=["random_draft", "shallow_draft"])
def draft(request: pytest.FixtureRequest) -> Drafter:
    """A draft other than the model itself: a tiny random one (little kept), the model's first layer (half kept)."""
    drafter: Drafter = request.getfixturevalue(request.param)
    return drafter


def chat(engine: Engine, text: str) -> list[int]:
    return engine.prompt_tokens(JobSpec(owner="t", model="m", messages=[{"role": "user", "content": text}]))


def batch_of(engine: Engine, proposer: Proposer | None, speculate: int = 4) -> ContinuousBatch:
    """A batch whose rows propose up to `speculate` tokens a step (0: none) from `proposer`, whatever it costs."""
    return ContinuousBatch(
        engine.model, 512, 4, None, speculation=Speculation(speculate, measured=False), proposer=proposer
    )


def answer(batch: ContinuousBatch, engine: Engine, arrivals: list[tuple[int, str, int]]) -> list[list[int]]:
    """Each question (`after`, text, max_tokens) joins once the batch has emitted `after` tokens; every answer."""
    out: dict[int, list[int]] = {}
    waiting = sorted(arrivals)
    emitted = 0
    uids = []
    while waiting or len(batch):
        while waiting and waiting[0][0] <= emitted:
            _, text, most = waiting.pop(0)
            uids.append(batch.insert(chat(engine, text), most, make_sampler(GREEDY), stops=engine.eos))
            out[uids[-1]] = []
        for e in batch.step():
            out[e.uid].append(e.token)
            emitted += 1
    return [out[u] for u in uids]


def test_a_model_drafting_for_itself_has_every_proposal_kept_and_answers_as_without(self_drafted):
    # Given the demo model as its own draft, and questions joining the batch at different times, answered with
    # proposals on and off
    prompts = [(0, QUESTIONS[0], 48), (0, QUESTIONS[1], 48), (20, QUESTIONS[2], 48), (45, QUESTIONS[3], 48)]
    off = batch_of(self_drafted, None, speculate=0)
    on = batch_of(self_drafted, self_drafted.drafter)

    # When each batch answers them
    answers_off, answers_on = answer(off, self_drafted, prompts), answer(on, self_drafted, prompts)

    # Then every answer is the same, token for token
    assert answers_on == answers_off
    # and every token the draft proposed was kept: several tokens a row a step
    assert on.work.proposed_tokens > 100
    assert on.work.accepted_tokens == on.work.proposed_tokens
    assert on.work.generated_tokens == off.work.generated_tokens
    assert on.work.steps < off.work.steps / 2


def test_another_draft_changes_no_answer_of_rows_joining_and_leaving(self_drafted, draft):
    # Given questions that join a batch at different times and leave it at different lengths (some at a stop token)
    arrivals = [(0, QUESTIONS[0], 40), (0, QUESTIONS[3], 9), (12, QUESTIONS[2], 30), (30, QUESTIONS[1], 48)]

    # When they are answered with a smaller draft's proposals, and without proposals
    on = batch_of(self_drafted, draft)
    answers_on = answer(on, self_drafted, arrivals)
    answers_off = answer(batch_of(self_drafted, None, speculate=0), self_drafted, arrivals)

    # Then every answer is the same, token for token: the draft proposed, and what it got wrong was not kept
    assert answers_on == answers_off
    assert on.work.proposed_tokens > 0
    assert on.work.accepted_tokens < on.work.proposed_tokens


def test_a_step_the_batch_keeps_plain_drafts_nothing(self_drafted, shallow_draft):
    # Given a batch that proposes only where it measures that it pays (it knows no step's time yet)
    batch = ContinuousBatch(self_drafted.model, 512, 4, None, speculation=Speculation(4), proposer=shallow_draft)
    batch.insert(chat(self_drafted, QUESTIONS[0]), 40, make_sampler(GREEDY))

    # When its first decode steps are plain (a plain step's time measured first)
    batch.step()
    batch.step()

    # Then the draft follows the row but has read nothing: drafting costs a forward pass a token, so the step's
    # width is chosen before the draft runs
    follower = batch._rows[0].lookup
    assert isinstance(follower, Draft) and follower.held == [] and batch.work.proposed_tokens == 0
    # and once a wider step is tried, it drafts
    while batch.work.proposed_tokens == 0 and len(batch):
        batch.step()
    assert batch.work.proposed_tokens > 0


def test_the_draft_proposes_its_greedy_continuation_and_follows_the_row_where_it_was_wrong(random_draft):
    # Given a row the draft follows
    model = random_draft.model
    row = random_draft.follow([1, 5, 9, 300, 42])

    # When it proposes 5 tokens
    first = random_draft.propose([row], [5])[0]

    # Then they are the draft's greedy continuation (read afresh, token by token)
    assert first == greedy(model, row.tokens, 5)

    # When the row keeps two of them and draws another token, and the draft proposes again
    row.extend([*first[:2], (first[2] + 1) % 2048])
    second = random_draft.propose([row], [3])[0]

    # Then it continues the row's tokens as they are now, its cache holding them and its own proposals but the last
    assert second == greedy(model, row.tokens, 3)
    assert row.held == row.tokens + second[:-1]
    assert_holds(row, model)


def test_each_rows_draft_cache_holds_what_the_row_kept_and_its_proposals_mid_answer(self_drafted, draft):
    # Given three questions answered with a smaller draft's proposals, the third joining later
    batch = batch_of(self_drafted, draft)
    for q in QUESTIONS[:2]:
        batch.insert(chat(self_drafted, q), 60, make_sampler(GREEDY))

    # When the batch steps (proposals kept and not, rows drafting together, each from where its draft was)
    checked = 0
    while len(batch):
        batch.step()
        if batch.work.steps == 6:
            batch.insert(chat(self_drafted, QUESTIONS[2]), 40, make_sampler(GREEDY))

        # Then after every step, each row's draft cache holds exactly the tokens it says, as the draft reading them
        # afresh writes them
        for row in [r.lookup for r in batch._rows]:
            if isinstance(row, Draft) and row.held:
                assert_holds(row, draft.model)
                checked += 1
    assert checked > 40
    assert batch.work.accepted_tokens < batch.work.proposed_tokens


def test_a_draft_of_another_vocabulary_is_refused_as_the_model_loads(tmp_path):
    # Given a draft whose tokenizer is not the demo model's
    from worker.demo_build.model import make_demo_model

    other = make_demo_model(tmp_path / "other-draft")

    # When the demo model loads with it, Then the load is refused, naming both models and why
    with pytest.raises(Unsupported, match=r"draft model other-draft cannot draft for onelane-demo: its tokenizer"):
        Engine.load(ModelConfig(name=DEMO_MODEL, path=str(SHIPPED_DEMO_MODEL), draft=str(other)))


def test_a_draft_with_other_end_tokens_is_refused(tmp_path, self_drafted):
    # Given a draft with the demo tokenizer whose config says another end token
    folder = tiny_llama(tmp_path / "eos-draft")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": 3}))

    # When it is loaded to draft for the demo model, Then it is refused
    with pytest.raises(Unsupported, match="its end tokens"):
        load_drafter(str(folder), "auto", DEMO_MODEL, self_drafted.tokenizer)


def test_the_models_list_says_a_model_speculates_with_its_draft(self_drafted, tmp_path):
    # Given a models file naming a draft beside its model
    (tmp_path / "models.toml").write_text(f'[models.m]\npath = "{SHIPPED_DEMO_MODEL}"\ndraft = "./tiny"\n')
    entry = ModelConfig.model_validate(read_models_file(str(tmp_path / "models.toml"))[0])

    # Then the draft's folder is the file's neighbour, and a model drafting speculates as "draft model NAME"
    assert entry.draft == str(tmp_path / "tiny")
    self_drafted.configure(4, 512, speculation=Speculation(4))
    try:
        assert self_drafted.speculation == "draft model demo"
    finally:
        self_drafted.configure(1, 512)


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    """The demo model served twice from one models file: with its first layer as its draft, and with a draft of
    another tokenizer."""
    from worker.demo_build.model import make_demo_model

    tables = {
        "drafted": {"path": str(SHIPPED_DEMO_MODEL), "draft": str(shallow_demo(tmp_path / "shallow-draft"))},
        "misdrafted": {"path": str(SHIPPED_DEMO_MODEL), "draft": str(make_demo_model(tmp_path / "other-draft"))},
    }
    return serve(settings, tmp_path, **tables)[0]


def test_a_served_model_drafts_and_one_whose_draft_does_not_fit_fails_naming_both(
    settings, jobs, store, start_worker, tmp_path
):
    # Given a worker serving the models file, speculating (always: whatever it costs this machine)
    start_worker(settings, speculate_always=True)

    # When a job asks the model with a fitting draft
    job = jobs.submit(messages=[{"role": "user", "content": QUESTIONS[2]}], max_tokens=40, temperature=0)
    done = wait_ended(store, job["id"], timeout_s=120)

    # Then it completes, its steps checked the draft's proposals and kept some; the models list says it drafts
    timings = jobs.get(job["id"])["timings"]
    assert done["status"] == "completed"
    assert 0 < timings["accepted_tokens"] < timings["proposed_tokens"]
    listed = {m["id"]: m for m in jobs.client.get("/v1/models").get_json()["data"]}
    assert listed["drafted"]["speculation"] == "draft model shallow-draft"
    # and the memory it holds counts its draft's weights beside its own (float32 on the CPU)
    index = json.loads((SHIPPED_DEMO_MODEL / "model.safetensors.index.json").read_text())
    assert int(store.redis.hget(keys.model("drafted"), "bytes")) > 4 * index["metadata"]["total_parameters"]

    # When a job asks the model whose draft has another tokenizer
    failed = wait_ended(store, jobs.submit("hi", model="misdrafted", max_tokens=4)["id"], timeout_s=120)

    # Then it fails: the model is unavailable, and why names both models (and no server path)
    assert (failed["status"], failed["error"]["type"]) == ("failed", "model_unavailable")
    message = failed["error"]["message"]
    assert "the draft model other-draft cannot draft for misdrafted: its tokenizer's vocabulary" in message, message
    assert str(tmp_path) not in message


def greedy(model: Any, tokens: list[int], n: int) -> list[int]:
    """`n` tokens after `tokens`, each the likeliest after all before it, read afresh each time (no cache)."""
    tokens = list(tokens)
    for _ in range(n):
        tokens.append(int(mx.argmax(model(mx.array([tokens]))[0, -1]).item()))
    return tokens[-n:]


def assert_holds(draft: Draft, model: Any) -> None:
    """The draft's cache holds its `held` tokens, as the model reading them afresh writes them."""
    fresh = make_prompt_cache(model)
    model(mx.array([draft.held]), cache=fresh)
    for mine, read in zip(draft.cache, fresh):
        assert mine.offset == read.offset == len(draft.held)
        n = len(draft.held)
        assert mx.allclose(mine.state[0][..., :n, :], read.state[0][..., :n, :], atol=1e-4)


def test_a_checkpoints_multi_token_prediction_heads_are_said_to_be_unused(tmp_path):
    # Given a checkpoint whose config says it carries a multi-token-prediction head (as DeepSeek V3's and GLM-4.5's
    # do), which mlx-lm drops as it loads
    folder = tiny_llama(tmp_path / "mtp")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))

    # When it is loaded and speculates
    engine = Engine.load(str(folder))
    engine.configure(2, 512, speculation=Speculation(4))

    # Then the models list says it proposes by prompt lookup, its head unused, and why
    assert engine.speculation == (
        "prompt lookup; its 1 multi-token-prediction head(s) unused: mlx-lm drops them as it loads"
    )
    assert Engine.load(str(tiny_llama(tmp_path / "plain"))).dropped_heads == 0
