"""Tiny random-weight folders of the two "pooling" model kinds mlx-vlm loads: an embedding model and a reranker.

Built offline in the spirit of mlx-vlm's own tests (tests/test_models.py: TestQwen3Embedding, TestXLMRoberta,
TestBert build a small config and let the model class initialise itself), but written to disk as the Hugging Face
hub ships such models, so that mlx-vlm's own loaders (`embedding_loader.load_embedding_model`,
`reranker_loader.load_reranker`) read them as they would a real checkpoint. Every folder is float32, its weights the
mlx-vlm class's own initialisation under a fixed seed, renamed to the hub's key names (the loaders' `sanitize` maps
them back), and has the demo model's tokenizer (worker/demo: a 2,048-token byte-level BPE whose only special tokens
are <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2) with the post-processor each kind's hub tokenizer has.

- `build_embedding(folder, pooling)`: a Qwen3-Embedding (sentence-transformers export): config.json of a
  `Qwen3Model`, model.safetensors with the keys unprefixed (`embed_tokens.weight`, `layers.0.self_attn.q_proj.weight`,
  `norm.weight`), modules.json (Transformer, Pooling, Normalize: no 2_Normalize folder, as git keeps no empty one),
  1_Pooling/config.json (last-token pooling as Qwen3-Embedding, or mean), config_sentence_transformers.json,
  sentence_bert_config.json. Its tokenizer appends <|endoftext|> to every text, as Qwen3-Embedding's does, and pads
  with that same token (the attention mask tells them apart).
- `build_reranker(folder, family)`: a one-label cross-encoder. "xlm-roberta" (the default) is bge-reranker's shape:
  `XLMRobertaForSequenceClassification`, keys `roberta.embeddings.*`, `roberta.encoder.layer.N.*`,
  `classifier.dense.*`, `classifier.out_proj.*`, pairs encoded `<s> q </s></s> d </s>` (<|im_start|> standing for
  <s>, <|im_end|> for </s>) and no token_type_ids (type_vocab_size 1); positions count from pad_token_id + 1, as in
  XLM-R, so config.json's pad_token_id is the tokenizer's (0). "bert" is the ms-marco MiniLM cross-encoders' shape:
  `BertForSequenceClassification`, keys `bert.embeddings.*`, `bert.encoder.layer.N.*`, `bert.pooler.dense.*`,
  `classifier.*`, pairs encoded `[CLS] q [SEP] d [SEP]` with token_type_ids 0 for the query, 1 for the document.

Padding: batched inputs padded on the RIGHT (the side each tokenizer_config.json names) give each row exactly what
it gives alone, for both kinds and every pooling mode (measured: a max difference of 0.0). Left padding does too for
the Qwen3 embedding (within 1e-6: its rotary positions are relative and padded keys are masked), but not for the
rerankers: both classify the first column, which left padding makes a pad (and BERT's positions start there too).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tasks.catalogue import SHIPPED_DEMO_MODEL

VOCAB = 2048  # the demo tokenizer's
SEED = 11
MAX_LENGTH = 1024  # the tokenizers' model_max_length
PAD, START, END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"  # ids 0, 1, 2 in the demo vocabulary
PAD_ID = 0

POOLING_KEYS = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "max": "pooling_mode_max_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}

QWEN3_EMBEDDING: dict[str, Any] = dict(
    architectures=["Qwen3Model"], model_type="qwen3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=MAX_LENGTH,
    rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=None, tie_word_embeddings=True, hidden_act="silu",
    attention_bias=False, attention_dropout=0.0, use_sliding_window=False, sliding_window=None, max_window_layers=2,
    bos_token_id=PAD_ID, eos_token_id=PAD_ID, initializer_range=0.02, use_cache=True, torch_dtype="float32",
)  # fmt: skip
ONE_LABEL: dict[str, Any] = dict(num_labels=1, id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
ENCODER: dict[str, Any] = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=VOCAB,
    hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.02,
    position_embedding_type="absolute", classifier_dropout=None, use_cache=True, torch_dtype="float32", **ONE_LABEL,
)  # fmt: skip
RERANKERS: dict[str, dict[str, Any]] = {
    "xlm-roberta": dict(
        ENCODER, architectures=["XLMRobertaForSequenceClassification"], model_type="xlm-roberta", type_vocab_size=1,
        layer_norm_eps=1e-5, pad_token_id=PAD_ID, bos_token_id=1, eos_token_id=2,
        max_position_embeddings=MAX_LENGTH + PAD_ID + 2,  # bge-reranker: 514 for 512 tokens and pad id 1
    ),
    "bert": dict(
        ENCODER, architectures=["BertForSequenceClassification"], model_type="bert", type_vocab_size=2,
        layer_norm_eps=1e-12, pad_token_id=PAD_ID, max_position_embeddings=MAX_LENGTH,
    ),
}  # fmt: skip
#: the hub checkpoint's prefix of the encoder's weights (the classification head has none)
HUB_PREFIX = {"xlm-roberta": "roberta.", "bert": "bert."}


def build_embedding(folder: Path, pooling: str = "lasttoken", **shape: Any) -> Path:
    """Write a tiny Qwen3-Embedding (sentence-transformers layout) pooling by `pooling` ("lasttoken", "mean", ...)
    into `folder`; returns `folder`. `shape` overrides the config's sizes (a benchmark's bigger model)."""
    if pooling not in POOLING_KEYS:
        raise ValueError(f"unknown pooling {pooling!r}: one of {sorted(POOLING_KEYS)}")
    from mlx_vlm.models import qwen3_embedding

    config = {**QWEN3_EMBEDDING, **shape}
    folder.mkdir(parents=True, exist_ok=True)
    model = seeded(lambda: qwen3_embedding.Model(qwen3_embedding.ModelConfig.from_dict(config)))
    save_weights(folder, {name.removeprefix("model."): w for name, w in parameters(model).items()})
    write_json(folder / "config.json", config)
    _write_sentence_transformers(folder, pooling, config["hidden_size"])
    appended_end = _template(
        [_seq("A", 0), _special(PAD, 0)], [_seq("A", 0), _special(PAD, 0), _seq("B", 1), _special(PAD, 1)]
    )
    _write_tokenizer(folder, appended_end, dict(pad_token=PAD), chat_template=True)
    return folder


def build_reranker(folder: Path, family: str = "xlm-roberta") -> Path:
    """Write a tiny one-label cross-encoder of `family` ("xlm-roberta": bge-reranker's, or "bert": ms-marco
    MiniLM's) into `folder`; returns `folder`."""
    if family not in RERANKERS:
        raise ValueError(f"unknown reranker family {family!r}: one of {sorted(RERANKERS)}")
    folder.mkdir(parents=True, exist_ok=True)
    config = RERANKERS[family]
    model = seeded(lambda: _classifier(config))
    prefix = HUB_PREFIX[family]
    weights = {(n if n.startswith("classifier.") else prefix + n): w for n, w in parameters(model).items()}
    save_weights(folder, weights)
    write_json(folder / "config.json", config)
    _write_reranker_tokenizer(folder, family)
    return folder


def _write_reranker_tokenizer(folder: Path, family: str) -> None:
    """The demo tokenizer encoding pairs as `family`'s hub tokenizer does: BERT's `[CLS] q [SEP] d [SEP]` with token
    types 0 and 1, or XLM-R's `<s> q </s></s> d </s>` without token types."""
    single = [_special(START, 0), _seq("A", 0), _special(END, 0)]
    specials: dict[str, Any] = dict(cls_token=START, sep_token=END, pad_token=PAD)
    if family == "bert":
        pair = [*single, _seq("B", 1), _special(END, 1)]
        names = ["input_ids", "token_type_ids", "attention_mask"]
    else:
        pair = [*single, _special(END, 0), _seq("B", 0), _special(END, 0)]
        names = ["input_ids", "attention_mask"]
        specials.update(bos_token=START, eos_token=END)
    _write_tokenizer(folder, _template(single, pair), dict(specials, model_input_names=names))


def _classifier(config: dict[str, Any]) -> Any:
    """mlx-vlm's sequence-classification model of `config`'s family, as its reranker loader builds it."""
    from mlx_vlm.models import bert, xlm_roberta

    module = xlm_roberta if config["model_type"] == "xlm-roberta" else bert
    return module.SequenceClassificationModel(module.ModelConfig.from_dict(config))


def seeded(make: Callable[[], Any]) -> Any:
    """`make()`'s model, initialised under SEED, in float32."""
    import mlx.core as mx

    mx.random.seed(SEED)
    model = make()
    model.set_dtype(mx.float32)
    return model


def parameters(model: Any) -> dict[str, Any]:
    from mlx.utils import tree_flatten

    return dict(tree_flatten(model.parameters()))


def save_weights(folder: Path, weights: dict[str, Any]) -> None:
    import mlx.core as mx

    mx.save_safetensors(str(folder / "model.safetensors"), dict(sorted(weights.items())), metadata={"format": "pt"})


def _write_sentence_transformers(folder: Path, pooling: str, width: int) -> None:
    """modules.json, 1_Pooling/config.json, config_sentence_transformers.json, sentence_bert_config.json."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    write_json(folder / "modules.json", modules)
    modes = {key: name == pooling for name, key in POOLING_KEYS.items()}
    (folder / "1_Pooling").mkdir(exist_ok=True)
    write_json(
        folder / "1_Pooling" / "config.json",
        {"word_embedding_dimension": width, **modes, "include_prompt": True},
    )
    prompts = {"query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"}
    write_json(
        folder / "config_sentence_transformers.json",
        {
            "__version__": {"sentence_transformers": "3.4.1", "transformers": "4.51.3", "pytorch": "2.6.0"},
            "prompts": {**prompts, "document": ""},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        },
    )
    write_json(folder / "sentence_bert_config.json", {"max_seq_length": MAX_LENGTH, "do_lower_case": False})


def _write_tokenizer(
    folder: Path, post_processor: dict[str, Any], settings: dict[str, Any], chat_template: bool = False
) -> None:
    """The demo tokenizer with `post_processor` and `settings` (special tokens, ...) over its tokenizer_config."""
    tokenizer = json.loads((SHIPPED_DEMO_MODEL / "tokenizer.json").read_text())
    tokenizer["post_processor"] = post_processor
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    config = json.loads((SHIPPED_DEMO_MODEL / "tokenizer_config.json").read_text())
    config.update(settings, model_max_length=MAX_LENGTH, padding_side="right")
    if chat_template:
        shutil.copy(SHIPPED_DEMO_MODEL / "chat_template.jinja", folder / "chat_template.jinja")
    else:
        config.pop("chat_template", None)
    write_json(folder / "tokenizer_config.json", config)


def _template(single: list[dict[str, Any]], pair: list[dict[str, Any]]) -> dict[str, Any]:
    """A tokenizers TemplateProcessing post-processor over the special tokens its pieces name."""
    names = sorted({piece["SpecialToken"]["id"] for piece in single + pair if "SpecialToken" in piece})
    ids = {PAD: 0, START: 1, END: 2}
    specials = {name: {"id": name, "ids": [ids[name]], "tokens": [name]} for name in names}
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials}


def _seq(name: str, type_id: int) -> dict[str, Any]:
    return {"Sequence": {"id": name, "type_id": type_id}}


def _special(token: str, type_id: int) -> dict[str, Any]:
    return {"SpecialToken": {"id": token, "type_id": type_id}}


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
