"""The tiny embedding and reranker folders (tests/tiny_kinds.py) load through mlx-vlm's own loaders and behave:
unit-norm embeddings, one logit per pair, padded batches equal to each input alone, weights that tell texts apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_vlm.embedding_loader import load_embedding_model
from mlx_vlm.models.pooling import read_pooling_config
from mlx_vlm.reranker_loader import load_reranker
from mlx_vlm.utils import load_processor
from transformers import AutoTokenizer

from tests.tiny_kinds import POOLING_KEYS, build_embedding, build_reranker

TEXTS = ["the quick brown fox jumps over the lazy dog", "hi"]
QUERY = "what is a cat"
DOCUMENTS = ["a cat is a small furry animal that purrs", "dogs", "the stock market fell again today"]
TOLERANCE = 1e-4


def load_embedding(folder: Path) -> tuple[Any, Any]:
    """The model and tokenizer as mlx-vlm's server loads an embedding model."""
    model = load_embedding_model(folder)
    model.pooling_config = read_pooling_config(folder)
    return model, load_processor(folder, add_detokenizer=False)


def embed(model: Any, tokenizer: Any, texts: list[str]) -> np.ndarray:
    encoded = tokenizer(texts, padding=True, return_tensors="np")
    out = model(mx.array(encoded["input_ids"]), attention_mask=mx.array(encoded["attention_mask"]))
    return np.array(out.text_embeds)


def score(model: Any, tokenizer: Any, query: str, documents: list[str]) -> np.ndarray:
    encoded = tokenizer([query] * len(documents), documents, padding=True, return_tensors="np")
    return np.array(model(**{key: mx.array(value) for key, value in encoded.items()}).logits)


def safetensors_keys(folder: Path) -> set[str]:
    return set(mx.load(str(folder / "model.safetensors")))


def test_embedding_folder_is_laid_out_as_the_hub_ships_it(tmp_path: Path) -> None:
    folder = build_embedding(tmp_path)
    keys = safetensors_keys(folder)
    assert {"embed_tokens.weight", "layers.0.self_attn.q_proj.weight", "layers.1.mlp.down_proj.weight"} <= keys
    assert "norm.weight" in keys and not any(key.startswith("model.") for key in keys)
    config = json.loads((folder / "config.json").read_text())
    assert (config["architectures"], config["model_type"], config["vocab_size"]) == (["Qwen3Model"], "qwen3", 2048)
    modules = json.loads((folder / "modules.json").read_text())
    assert [module["path"] for module in modules] == ["", "1_Pooling", "2_Normalize"]
    assert read_pooling_config(folder)["pooling_mode_lasttoken"] is True
    assert (folder / "config_sentence_transformers.json").exists()


@pytest.mark.parametrize("pooling", ["lasttoken", "mean"])
def test_embeddings_are_unit_norm_and_tell_texts_apart(tmp_path: Path, pooling: str) -> None:
    model, tokenizer = load_embedding(build_embedding(tmp_path, pooling))
    assert read_pooling_config(tmp_path)[POOLING_KEYS[pooling]] is True
    embeddings = embed(model, tokenizer, TEXTS)
    assert embeddings.shape == (2, 64)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=-1), 1.0, atol=1e-5)
    assert float(embeddings[0] @ embeddings[1]) < 0.999


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("pooling", ["lasttoken", "mean"])
def test_a_padded_batch_embeds_each_text_as_alone(tmp_path: Path, pooling: str, side: str) -> None:
    model, tokenizer = load_embedding(build_embedding(tmp_path, pooling))
    assert tokenizer.padding_side == "right" and tokenizer.pad_token == "<|endoftext|>"
    tokenizer.padding_side = side
    encoded = tokenizer(TEXTS, padding=True, return_tensors="np")
    assert encoded["attention_mask"].min() == 0  # the short text is padded
    batch = embed(model, tokenizer, TEXTS)
    alone = np.concatenate([embed(model, tokenizer, [text]) for text in TEXTS])
    assert np.abs(batch - alone).max() < TOLERANCE


def test_the_embedding_tokenizer_ends_every_text_as_qwen3_embeddings_does(tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(build_embedding(tmp_path))
    assert tokenizer("hi").input_ids[-1] == tokenizer.pad_token_id == 0
    assert tokenizer.model_max_length == 1024


@pytest.mark.parametrize("family, prefix", [("xlm-roberta", "roberta."), ("bert", "bert.")])
def test_reranker_folder_is_laid_out_as_the_hub_ships_it(tmp_path: Path, family: str, prefix: str) -> None:
    folder = build_reranker(tmp_path, family)
    keys = safetensors_keys(folder)
    head = (
        {"classifier.dense.weight", "classifier.out_proj.weight"} if family == "xlm-roberta" else {"classifier.weight"}
    )
    assert head <= keys
    assert f"{prefix}encoder.layer.0.attention.self.query.weight" in keys
    assert all(key.startswith((prefix, "classifier.")) for key in keys)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"][0].endswith("ForSequenceClassification")
    assert (config["num_labels"], config["id2label"], config["vocab_size"]) == (1, {"0": "LABEL_0"}, 2048)


@pytest.mark.parametrize("family", ["xlm-roberta", "bert"])
def test_reranker_scores_each_pair_in_a_padded_batch_as_alone(tmp_path: Path, family: str) -> None:
    model, tokenizer = load_reranker(build_reranker(tmp_path, family))
    scores = score(model, tokenizer, QUERY, DOCUMENTS)
    assert scores.shape == (len(DOCUMENTS), 1)
    alone = np.concatenate([score(model, tokenizer, QUERY, [document]) for document in DOCUMENTS])
    assert np.abs(scores - alone).max() < TOLERANCE
    assert np.ptp(scores) > 10 * TOLERANCE  # random weights, but the documents score differently


@pytest.mark.parametrize("family", ["xlm-roberta", "bert"])
def test_reranker_tokenizer_encodes_pairs_with_separators(tmp_path: Path, family: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(build_reranker(tmp_path, family))
    encoded = tokenizer([QUERY, QUERY], DOCUMENTS[:2], padding=True, return_tensors="np")
    ids = encoded["input_ids"][1][encoded["attention_mask"][1] == 1].tolist()
    query = tokenizer(QUERY, add_special_tokens=False).input_ids
    document = tokenizer(DOCUMENTS[1], add_special_tokens=False).input_ids
    separator = [2, 2] if family == "xlm-roberta" else [2]
    assert ids == [1, *query, *separator, *document, 2]
    if family == "bert":
        assert encoded["token_type_ids"][1].tolist()[: len(ids)] == [0] * (len(query) + 2) + [1] * (len(document) + 1)
    else:
        assert "token_type_ids" not in encoded  # XLM-R has one token type and its tokenizer returns none


@pytest.mark.parametrize("family", ["xlm-roberta", "bert"])
def test_left_padding_is_not_for_rerankers(tmp_path: Path, family: str) -> None:
    model, tokenizer = load_reranker(build_reranker(tmp_path, family))
    right = score(model, tokenizer, QUERY, DOCUMENTS)
    tokenizer.padding_side = "left"
    assert np.abs(score(model, tokenizer, QUERY, DOCUMENTS) - right).max() > 10 * TOLERANCE
