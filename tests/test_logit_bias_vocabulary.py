"""`logit_bias` names the tokenizer's tokens: a model's logit rows past them (padding: Qwen's models have 151,936 for
151,669 tokens) are no token, and biasing one is refused naming the field, before anything is generated."""

from __future__ import annotations

from pathlib import Path

import pytest

TEXTS = ["One request at a time; the queue keeps the GPU busy and the users informed. Hello! How are you today?"] * 4
PADDING = 64  # logit rows past the tokenizer's vocabulary


@pytest.fixture(scope="module")
def padded_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A tiny random model whose embedding (and logits) has PADDING more rows than its tokenizer has tokens; and the
    tokenizer's size."""
    import mlx.core as mx
    from mlx_lm.models import llama

    from worker.demo_build.model import SIZES, llama_config, save, train_tokenizer

    tokenizer = train_tokenizer(TEXTS, vocab_size=300)
    config = {**llama_config(SIZES["tiny"], tokenizer), "vocab_size": len(tokenizer) + PADDING}
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    return save(tmp_path_factory.mktemp("models") / "padded", model, tokenizer, config), len(tokenizer)


@pytest.fixture
def settings(settings, padded_model):  # type: ignore[no-untyped-def]
    return settings.model_copy(update={"model": str(padded_model[0])})


def test_a_bias_on_a_padding_row_is_refused_and_one_on_the_last_token_is_not(app, settings, padded_model, start_worker):
    # Given a model whose logits are wider than its tokenizer's vocabulary
    start_worker(settings)
    client, tokens = app.test_client(), padded_model[1]
    body = {"model": settings.model_name, "prompt": "Hello", "max_tokens": 4, "temperature": 0}

    # When a request biases a padding row (an id past the tokenizer's, within the logits' width)
    refused = client.post("/v1/completions", json={**body, "logit_bias": {str(tokens + 3): 100}})

    # Then it is refused naming the field and the vocabulary's size: nothing is generated from padding
    error = refused.get_json()["error"]
    assert refused.status_code == 400 and error["param"] == "logit_bias", refused.get_json()
    assert f"{tokens + 3}" in error["message"] and f"{tokens} tokens" in error["message"]

    # While the tokenizer's last token may be biased: it is what the answer is made of
    forced = client.post("/v1/completions", json={**body, "logit_bias": {str(tokens - 1): 100}, "logprobs": 0})
    assert forced.status_code == 200, forced.get_json()
    assert forced.get_json()["choices"][0]["logprobs"]["tokens"][0] != ""
