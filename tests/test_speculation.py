"""Speculation inside the continuous batch (worker/batch/speculation.py, worker/batch/lookup.py): each decode row
proposes its next tokens from its own prompt and answer, one forward pass checks every row's proposals, and the
answers are the very ones a token-a-step batch gives, greedy or seeded; only the steps are fewer."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import mlx.core as mx
import pytest
from mlx_lm.sample_utils import greedy_sampler

from tasks.job import JobSpec, SamplingParams
from tasks.structured import json_constraint
from worker.batch.forward import ContinuousBatch
from worker.batch.lookup import Lookup
from worker.batch.sampling import make_sampler
from worker.batch.speculation import BUDGET, REFRESH, STALE, Payoff, Speculation

# SmolLM2-135M-Instruct: a real model that copies what it is shown
# (a hang guard, not a budget: beside two busy processes and the suite's other worker, one story here took over 120 s)
pytestmark = [pytest.mark.default_model, pytest.mark.slow_file, pytest.mark.timeout(300)]

CODE = "\n".join(f"def f{i}(x):\n    return x * {i} + {i * 7}\n" for i in range(8))
QUESTIONS = (
    f"Repeat this code exactly, nothing else:\n{CODE}",
    "Tell me about the sea.",  # free text: little to copy
    "Copy this line five times: the cat sat on the mat.",
)


def chat(engine: Any, text: str) -> list[int]:
    return engine.prompt_tokens(JobSpec(owner="t", model="m", messages=[{"role": "user", "content": text}]))


def speculating(engine: Any, speculate: int = 4) -> ContinuousBatch:
    """A batch whose rows propose up to `speculate` tokens a step, whatever it costs this machine (the stories check
    what proposing gives, not its speed: ONELANE_SPECULATE_ALWAYS)."""
    return ContinuousBatch(engine.model, 512, 4, None, speculation=Speculation(speculate, measured=False))


def answer_all(engine: Any, prompts: list[list[int]], params: SamplingParams, speculate: int) -> dict[str, Any]:
    """Every prompt's tokens, answered at once in one batch with speculation `speculate` (0: off), each sequence's
    KV cache as it left, and the batch's work."""
    batch = speculating(engine, speculate)
    eos = frozenset(engine.tokenizer.eos_token_ids)
    uids = [batch.insert(p, params.max_tokens, make_sampler(params), stops=eos) for p in prompts]
    out: dict[int, list[int]] = {u: [] for u in uids}
    kv: dict[int, Any] = {}
    while len(batch):
        for e in batch.step():
            out[e.uid].append(e.token)
            if e.finish_reason is not None:
                kv[e.uid] = (e.cache, e.tokens)
    return {"answers": [out[u] for u in uids], "kv": [kv[u] for u in uids], "work": batch.work}


@pytest.fixture(scope="module")
def greedy(smollm2_engine: Any) -> dict[str, dict[str, Any]]:
    """The three questions answered at once, greedy, with speculation off and on."""
    prompts = [chat(smollm2_engine, q) for q in QUESTIONS]
    params = SamplingParams(temperature=0, max_tokens=48)
    return {
        "off": answer_all(smollm2_engine, prompts, params, speculate=0),
        "on": answer_all(smollm2_engine, prompts, params, speculate=4),
    }


def test_greedy_answers_with_speculation_are_token_for_token_those_without_in_fewer_steps(greedy):
    # Given three questions, one asking to copy code it is shown, answered at once with speculation off, then on
    on, off = greedy["on"], greedy["off"]

    # Then every answer is the same, token for token
    assert on["answers"] == off["answers"]
    # and the batch checked proposals and kept most of those of the copying answer: fewer steps for as many tokens
    assert on["work"].accepted_tokens > 20
    assert on["work"].generated_tokens == off["work"].generated_tokens
    assert on["work"].steps < off["work"].steps


def test_each_sequences_kv_cache_leaves_the_batch_as_without_speculation(greedy):
    # Given the three answers with speculation on and off (entries moved within the batch's cache as rows are cut)
    on, off = greedy["on"], greedy["off"]

    # Then each sequence's KV cache, as it leaves (for the prefix cache), holds the same tokens in the same order
    for (cache_on, tokens_on), (cache_off, tokens_off) in zip(on["kv"], off["kv"]):
        assert tokens_on == tokens_off
        for layer_on, layer_off in zip(cache_on, cache_off):
            assert layer_on.offset == layer_off.offset
            keys_on, keys_off = layer_on.state[0], layer_off.state[0]
            assert keys_on.shape[2] >= len(tokens_on)
            assert mx.allclose(keys_on[..., : len(tokens_on), :], keys_off[..., : len(tokens_off), :], atol=1e-4)


def test_a_seeded_sampled_answer_is_the_same_with_speculation_on_and_off(engine):
    # Given seeded sampled requests (one copying), answered together
    prompts = [chat(engine, q) for q in QUESTIONS]
    params = SamplingParams(temperature=0.7, top_p=0.95, seed=11, max_tokens=40)

    # When answered with speculation off and on
    off = answer_all(engine, prompts, params, speculate=0)
    on = answer_all(engine, prompts, params, speculate=4)

    # Then each text is the same: every token drawn with its own place's key, kept or not
    assert on["answers"] == off["answers"]
    assert on["work"].accepted_tokens > 0


def copy_beside_a_long_prompt(engine: Any, speculate: int, until: int) -> dict[str, Any]:
    """A stream copying code while a long prompt reads beside it, under a floor no step meets (its chunks the
    least): the stream's answer (once the prompt is read, on until it has `until` tokens), its tokens in each step
    that read the prompt, and the most tokens any such step's draw was expected to give the row it gives the fewest
    (the floor's bound, in a plain step's)."""
    batch = ContinuousBatch(
        engine.model, 128, 4, None, decode_floor=1000, speculation=Speculation(speculate, measured=False)
    )
    eos = frozenset(engine.tokenizer.eos_token_ids)
    stream = batch.insert(chat(engine, QUESTIONS[0]), 120, greedy_sampler, stops=eos)
    answer: list[int] = []
    while len(answer) < 24:  # it copies by now: what it proposes is kept
        answer += [e.token for e in batch.step() if e.uid == stream]
    long = batch.insert(chat(engine, "Summarise: " + CODE * 3), 1, greedy_sampler)
    per_step, least = [], 1.0
    while batch.find(long) is not None and batch.find(long)[0] != "decoding":  # type: ignore[index]
        emitted = batch.step()
        per_step.append(sum(e.uid == stream for e in emitted))
        answer += [e.token for e in emitted if e.uid == stream]
        least = max(least, batch._least)
    while batch.find(stream) is not None and len(answer) < until:
        answer += [e.token for e in batch.step() if e.uid == stream]
    return {"answer": answer, "per_step": per_step, "least": least}


def test_a_stream_checks_its_proposals_in_the_steps_that_read_a_long_prompt_beside_it(smollm2_engine):
    # Given a stream copying code, and a long prompt arriving while it does (past the prefill step of 128 tokens:
    # read in chunks of the least, 16 tokens)
    on = copy_beside_a_long_prompt(smollm2_engine, speculate=4, until=0)
    off = copy_beside_a_long_prompt(smollm2_engine, speculate=0, until=len(on["answer"]))  # (as many tokens)

    # Then while the prompt reads, the stream still checks its proposals: several tokens in some steps, at least
    # one in each (its answer the same as a token a step)
    assert on["answer"] == off["answer"]
    assert len(on["per_step"]) >= 8
    assert all(n >= 1 for n in on["per_step"][:-2]), on["per_step"]
    assert sum(on["per_step"]) > len(on["per_step"]) + 4, on["per_step"]
    assert all(n <= 1 for n in off["per_step"])
    # and the floor's bound for such a step is as long as the tokens it expects the stream to keep (the chunks grow
    # by as much): more than a plain step's
    assert on["least"] > 1.5 and off["least"] == 1.0


RECORD = {"id": 48213, "name": "quiet ledger", "owner": "Ada Brennan", "town": "Dunmere", "tags": ["fresh", "plain"]}
RECORD_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        **{key: {"type": "string"} for key in ("name", "owner", "town")},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": list(RECORD),
    "additionalProperties": False,
}


def test_a_constrained_answer_checks_its_proposals_against_its_grammar_and_writes_the_same(engine):
    # Given a request to copy a JSON record under its schema (written as the grammar writes it: no spaces), beside a
    # free question, greedy
    prompts = [
        chat(engine, f"Repeat this JSON exactly:\n{json.dumps(RECORD, separators=(',', ':'))}"),
        chat(engine, QUESTIONS[1]),
    ]
    grammar = json_constraint(RECORD_SCHEMA, "response_format").grammar
    eos = frozenset(engine.tokenizer.eos_token_ids)

    def answer(speculate: int) -> tuple[list[int], int, int]:
        batch = speculating(engine, speculate)
        constraint = engine.grammars.constrain(grammar)
        greedy = make_sampler(SamplingParams(temperature=0))
        uid = batch.insert(prompts[0], 120, greedy, [constraint], stops=eos)
        batch.insert(prompts[1], 60, greedy, stops=eos)
        tokens, proposed, kept = [], 0, 0
        while len(batch):
            for e in batch.step():
                if e.uid == uid:
                    tokens.append(e.token)
                    proposed, kept = proposed + e.proposed, kept + e.accepted
        return tokens, proposed, kept

    # When answered with speculation off, then on
    off, _, _ = answer(0)
    on, proposed, kept = answer(8)

    # Then the answer is the same, token for token, and valid; and the constrained row proposed (each proposal
    # checked against the grammar, each place masked as the grammar stood there), most of it kept
    assert on == off
    jsonschema.validate(json.loads(engine.tokenizer.decode(on[:-1])), RECORD_SCHEMA)
    assert kept > 10 and kept >= proposed / 2, (proposed, kept, engine.tokenizer.decode(on))


def test_a_constrained_job_speculating_in_the_worker_writes_what_it_writes_a_token_a_step(jobs, store, start_worker):
    from tests.helpers import wait_ended

    # Given a job copying a JSON record under its schema, answered by a worker that does not speculate
    record = json.dumps(RECORD, separators=(",", ":"))
    body = {
        "messages": [{"role": "user", "content": f"Repeat this JSON exactly:\n{record}"}],
        "max_tokens": 120,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "record", "schema": RECORD_SCHEMA}},
    }
    worker = start_worker(speculate=0)
    plain = jobs.submit(**body)
    wait_ended(store, plain["id"], timeout_s=120)
    worker.stop()

    # When the same job runs on a worker that speculates (always, 8 tokens: a proposal runs to the record's end and
    # its grammar's), its forced keys fast-forwarded as ever
    start_worker(speculate_always=True, speculate=8)
    job = jobs.submit(**body)
    assert wait_ended(store, job["id"], timeout_s=120)["status"] == "completed"

    # Then it writes the same text, valid, and ends where its grammar does; its steps kept proposals
    answer, before = jobs.get(job["id"]), jobs.get(plain["id"])
    assert answer["output"] == before["output"]
    jsonschema.validate(json.loads(answer["output"]), RECORD_SCHEMA)
    assert answer["finish_reason"] == "stop"
    assert answer["timings"]["accepted_tokens"] > 0


def test_n_3_seeded_choices_are_the_same_with_speculation_on_and_off(live_server, settings, start_worker, jobs):
    import requests

    from tests.test_health import scrape

    # Given a request for 3 seeded sampled choices of an answer copying code it is shown
    body = {
        "model": settings.model_name,
        "messages": [{"role": "user", "content": QUESTIONS[0]}],
        "n": 3,
        "seed": 7,
        "temperature": 0.6,
        "max_tokens": 60,
    }

    def choices() -> list[str]:
        answer = requests.post(f"{live_server}/v1/chat/completions", json=body, timeout=300).json()
        return [c["message"]["content"] for c in sorted(answer["choices"], key=lambda c: c["index"])]

    # When a worker that does not speculate answers it, then one that always does
    worker = start_worker(speculate=0)
    plain = choices()
    worker.stop()
    start_worker(speculate_always=True)
    speculated = choices()

    # Then each choice is the same text (the three share their prompt's KV state, and draw with keys of their own)
    assert speculated == plain
    assert len(set(plain)) > 1
    assert scrape(jobs.client)[f"onelane_model_tokens_accepted_total{{model={settings.model_name}}}"] > 0


def test_a_row_proposes_the_tokens_that_followed_the_longest_ngram_ending_its_sequence():
    lookup = Lookup([1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 7, 1, 2])
    assert lookup.propose(3) == [3, 5, 6]  # "1 2" last occurred before at 5: then 3 5 6
    lookup.extend([3])
    assert lookup.propose(2) == [5, 6]  # "1 2 3" last at 5..7: then 5 6
    assert Lookup([1, 2, 3]).propose(4) == []  # nothing occurred before
    assert lookup.propose(0) == []


def test_a_jobs_timings_and_the_metrics_show_what_was_proposed_and_kept(jobs, store, start_worker):
    from tests.helpers import wait_ended
    from tests.test_health import scrape

    # Given the default model served, speculating (always: whatever it costs this machine)
    start_worker(speculate_always=True)
    model = jobs.client.get("/v1/models").get_json()["data"][0]
    assert model["speculation"] == "prompt lookup"

    # When a job asks it to copy code it is shown
    job = jobs.submit(messages=[{"role": "user", "content": QUESTIONS[0]}], max_tokens=60, temperature=0)
    done = wait_ended(store, job["id"], timeout_s=120)

    # Then its timings say how many tokens its steps checked as proposed, and kept; and /metrics counts them by model
    timings = jobs.get(job["id"])["timings"]
    assert done["status"] == "completed"
    assert 0 < timings["accepted_tokens"] <= timings["proposed_tokens"]
    metrics = scrape(jobs.client)
    assert metrics[f"onelane_model_tokens_accepted_total{{model={model['id']}}}"] == timings["accepted_tokens"]
    assert metrics[f"onelane_model_tokens_proposed_total{{model={model['id']}}}"] == timings["proposed_tokens"]


def test_a_sequences_kv_cache_taken_mid_answer_holds_its_tokens_in_order_and_nothing_proposed(engine):
    from mlx_lm.models.cache import make_prompt_cache

    # Given the copying question and a free one answered together, speculating, several steps in (entries moved
    # within the batch's cache, and the last step's proposals written past each sequence's tokens)
    prompts = [chat(engine, QUESTIONS[0]), chat(engine, QUESTIONS[1])]
    batch = speculating(engine)
    uids = [batch.insert(p, 100, make_sampler(SamplingParams(temperature=0))) for p in prompts]
    while batch.work.accepted_tokens < 10 or batch._proposed is None or not any(r.order for r in batch._rows):
        batch.step()

    # When a copy of each one's cache is taken (as a group's leader's is for its followers)
    for uid in uids:
        cache, tokens = batch.extract(uid)

        # Then it holds exactly its tokens, in order: as the model reading them afresh writes them
        fresh = make_prompt_cache(engine.model)
        engine.model(mx.array([tokens]), cache=fresh)
        for taken, read in zip(cache, fresh):
            assert taken.offset == read.offset == len(tokens)
            assert mx.allclose(taken.state[0][..., : len(tokens), :], read.state[0][..., : len(tokens), :], atol=1e-3)


def live(
    payoff: Payoff,
    rows: int,
    proposals: list[tuple[int, float]],
    steps: int,
    fixed: float,
    row: float,
    proposal: float | None = None,
):
    """`steps` steps of `rows` rows proposing (length, kept rate) each, on a machine where a step costs `fixed`,
    plus `row` a row and `proposal` a proposal read (by default as much as a row); the widths chosen."""
    widths = []
    for _ in range(steps):
        wide = payoff.width(rows, proposals, BUDGET)
        widths.append(wide)
        payoff.observe(rows, wide, fixed + row * rows + (row if proposal is None else proposal) * rows * (wide - 1))
    return widths


def test_a_step_reads_as_wide_as_pays_where_reading_more_tokens_costs_little():
    # Given one sequence whose proposals are mostly kept, where a token more costs a tenth of a step
    payoff = Payoff()
    widths = live(payoff, 1, [(4, 0.9)], steps=100, fixed=0.05, row=0.005)

    # Then, once a step that checks proposals is measured (it says a token more costs little), the step reads the
    # row's token and all 4 proposals
    assert widths[:3] == [1, 2, 5]
    assert widths[-20:].count(5) >= 19
    # but for one plain step every REFRESH steps, which keeps a plain step's time known
    assert widths[-REFRESH:].count(1) == 1


def test_a_full_batch_on_a_compute_bound_machine_backs_off():
    # Given 32 rows whose proposals are kept as often, where every token read costs the same (nothing is fixed)
    payoff = Payoff()
    widths = live(payoff, 32, [(4, 0.9)] * 32, steps=100, fixed=0.0, row=0.003)

    # Then after trying a second token a row once, it reads one (it gives 1.9 tokens a row for twice the time)
    assert widths[:3] == [1, 2, 1]
    assert set(widths[3:]) == {1}


def test_a_batch_whose_rows_cost_much_still_checks_proposals_that_cost_little():
    # Given a batch that filled a row at a time, each row costing 12 ms (its cache, its draw) on 40 ms, but a
    # proposal read only 2 ms (its place in the matrix products)
    payoff = Payoff()
    for rows in range(1, 9):
        live(payoff, rows, [], steps=4, fixed=0.04, row=0.012, proposal=0.002)

    # When its 8 rows propose 3 tokens each, kept at 0.8
    widths = live(payoff, 8, [(3, 0.8)] * 8, steps=20, fixed=0.04, row=0.012, proposal=0.002)

    # Then, once one step that checks proposals is measured, every step reads all of them: a row's cost does not
    # price a proposal
    assert widths[:2] == [2, 4]
    assert set(widths[1:]) == {4}


def test_a_batch_that_fills_until_its_steps_turn_compute_bound_stops_checking_proposals_there():
    # Given a machine whose step costs 10 ms plus 2 ms a token read, but never less than 24 tokens' worth (a few
    # tokens cost what their weights' reading costs; many, what their products cost), and a batch that fills a row
    # at a time, 6 steps a size, its rows proposing 4 tokens kept at 0.8
    def step_s(rows: int, wide: int) -> float:
        return 0.01 + 0.002 * max(rows * wide, 24)

    payoff = Payoff()
    widths: dict[int, list[int]] = {}
    for rows in [r for r in range(1, 33) for _ in range(6)] + [32] * 300:
        wide = payoff.width(rows, [(4, 0.8)] * rows, BUDGET)
        payoff.observe(rows, wide, step_s(rows, wide))
        widths.setdefault(rows, []).append(wide)

    # Then the few rows read all their proposals, and the full batch (2 tokens a row: 1.8 kept for twice the
    # time) reads one a row, once what a checked step of 32 rows costs is measured: the line through the smaller
    # sizes prices it below that
    assert widths[4][-1] == 5
    assert widths[32][-300:].count(1) >= 299


def test_one_slow_step_does_not_make_a_wider_step_look_cheaper():
    # Given a batch that measured its steps of 8 rows at 1, 2 and 3 tokens a row many times (a token more costs
    # 4.5 ms on 95 ms)
    payoff = Payoff()
    for _ in range(20):
        for wide in (1, 2, 3):
            payoff.observe(8, wide, 0.095 + 0.0045 * 8 * wide)
    # and once, at 7 rows, a slow plain step (a row had just left: the batch's caches were filtered)
    payoff.observe(7, 1, 0.21)

    # When 7 rows propose, one of them often kept, the others seldom
    wide = payoff.width(7, [(4, 0.6)] + [(1, 0.1)] * 6, BUDGET)

    # Then the step is plain: by the fit through every size, reading 14 tokens costs more than it gives
    assert wide == 1


def test_little_kept_proposes_nothing_and_a_step_size_not_seen_for_long_is_tried_again():
    # Given 8 rows whose proposals are seldom kept, where a token more a row costs half a step
    payoff = Payoff()
    widths = live(payoff, 8, [(2, 0.1)] * 8, steps=STALE + 20, fixed=0.04, row=0.005)

    # Then a step of two tokens a row is tried (to price a proposal), then none is read again until what it cost is forgotten
    assert widths[:3] == [1, 2, 1]
    assert widths[3:STALE].count(2) == 0
    assert widths[STALE:].count(2) == 1
