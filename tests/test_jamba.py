"""A Jamba built from mlx-lm's own test config (issue 60, item 12): its Mamba layers read a prompt's chunk in a time
that grows with the chunk's square (mlx-lm's `ssm_step` copies its state for each token), so that the worker, timing
its steps on a 64-token prompt as it loaded, held the device for minutes after the batching trial while its jobs
waited, silently. Now the load finds the chunk the model reads cheapest (worker/batch/chunking.py), and three
prompts sent at once are answered, token for token, as mlx-lm alone answers them."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from tasks.broker import Doorbell
from tasks.catalogue import SHIPPED_DEMO_MODEL
from tasks.job import JobSpec, SamplingParams, new_job_id
from tests.helpers import wait_ended
from tests.test_hostile_models import serve
from tests.tiny_archs import TOKENIZER_FILES, alone

# (its load, the chunk first, then the trial and the step timing: 15 s at load 3)
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow_file]

#: mlx-lm's own test config of Jamba (its tests/test_models.py), with the demo tokenizer's vocabulary. Its Mamba layers
#: stay 128 times as wide as its hidden size (the story 40 s alone). At 16, 32 or 64, a chunk of 2 tokens costs too
#: little more than twice one of 1 on a busy machine: there the load's search (worker/batch/chunking.py) chose the
#: whole prefill step in 1 or 2 of 4 tries, and the story failed in a loaded run. At 128, 2 tokens cost 7-10 times
#: what 1 does there (0.73-0.86 s against 0.07-0.13), and the search chose 1 token in 4 of 4 tries.
CONFIG = {
    "model_type": "jamba", "hidden_size": 128, "intermediate_size": 128, "num_hidden_layers": 8,
    "num_attention_heads": 4, "num_key_value_heads": 2, "attn_layer_offset": 1, "attn_layer_period": 2,
    "expert_layer_offset": 1, "expert_layer_period": 2, "mamba_d_conv": 4, "mamba_d_state": 128,
    "mamba_expand": 128, "num_experts": 4, "num_experts_per_tok": 2, "rms_norm_eps": 1e-05,
    "max_position_embeddings": 1000, "vocab_size": 2048, "eos_token_id": 2,
}  # fmt: skip
PROMPTS = ("hi", "the queue keeps the gpu busy", "a job waits, starts, streams its tokens, then ends")
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def jamba(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model, float32, its class's own initialisation, and the demo tokenizer."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    folder = tmp_path_factory.mktemp("jamba")
    model_class, args_class = _get_classes(CONFIG)
    mx.random.seed(0)
    model = model_class(args_class.from_dict(CONFIG))
    model.set_dtype(mx.float32)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())), {"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(CONFIG))
    for name in TOKENIZER_FILES:
        shutil.copy(SHIPPED_DEMO_MODEL / name, folder / name)
    return folder


def test_a_jambas_three_prompts_at_once_are_answered_as_mlx_lm_alone_answers_them(
    jamba, settings, tmp_path, start_worker, store, caplog
):
    # Given the Jamba served from a models file, loaded by the worker (the trial, the chunk, its steps timed)
    served = serve(settings, tmp_path, jamba={"path": str(jamba)})[0]
    with caplog.at_level(logging.INFO, logger="worker"):
        worker = start_worker(served)
    said = [r.getMessage() for r in caplog.records if r.name == "worker.models"]
    assert any("reads 1 token(s) a step" in m for m in said), said

    # When three greedy prompts are sent at once
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    jobs = [(new_job_id(), JobSpec(owner="u", model="jamba", prompt=p, params=params)) for p in PROMPTS]
    store.admit_all(jobs, 600, doorbell=Doorbell.ring(worker.broker, jobs[0][0]))

    # Then each is answered as mlx-lm answers it alone, token for token
    from mlx_lm.utils import load_model, load_tokenizer

    model, tokenizer = load_model(jamba)[0], load_tokenizer(jamba, eos_token_ids=2)
    for (job_id, _), prompt in zip(jobs, PROMPTS):
        done = wait_ended(store, job_id, timeout_s=300)
        assert done["status"] == "completed", done
        # (mlx-lm reading its prompt a token at a time too: whole, it costs this Jamba the square of its length)
        assert done["output"] == alone(model, tokenizer, tokenizer.encode(prompt), MAX_TOKENS, prefill_step=1).text
