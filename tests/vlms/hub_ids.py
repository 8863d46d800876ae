"""The demo tokenizer with a family's special tokens at the ids the hub gives them, for a processor that names them
by constant ids (dots.ocr's <|imgpad|> is 151665 whatever its tokenizer says; HunYuan VL's image tokens 120118 on):
the tokenizer write_folder wrote (its added tokens after the demo vocabulary) moved so, every id between the demo
vocabulary and the last special a filler piece no text encodes to. The text model's vocab_size must reach them (its
embeddings are as many rows: several megabytes at width 32-64, a constant of mlx-vlm's code)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.vlms.folder import DEMO_VOCAB


def place(folder: Path, ids: dict[str, int], size: int) -> None:
    """Move the added tokens named in `ids` to those ids in `folder`'s tokenizer.json, the others filler pieces up to
    `size` ids."""
    path = folder / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    for entry in tokenizer["added_tokens"]:
        if entry["content"] in ids:
            entry["id"] = ids[entry["content"]]
    vocab = tokenizer["model"]["vocab"]
    vocab.update({f"<|filler_{i}|>": i for i in range(DEMO_VOCAB, size)})
    for entry in tokenizer["added_tokens"]:  # (in the model's vocabulary too: the tokenizer keeps their ids so)
        vocab.pop(f"<|filler_{entry['id']}|>", None)
        vocab[entry["content"]] = entry["id"]
    path.write_text(json.dumps(tokenizer, ensure_ascii=False))
