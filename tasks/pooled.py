"""A pooled job's answer, as the worker writes it into the job's output and the web reads it back: one JSON object,
`{"embeddings": [...]}` (each vector as base64 of little-endian float32, which is also OpenAI's `base64` encoding)
or `{"scores": [...]}` (one relevance score in [0, 1] per document, in the documents' order)."""

from __future__ import annotations

import base64
import json
import sys
from array import array


def embeddings_output(vectors: list[bytes]) -> str:
    """The output of an embedding job, from each vector's float32 little-endian bytes."""
    return json.dumps({"embeddings": [base64.b64encode(v).decode() for v in vectors]})


def scores_output(scores: list[float]) -> str:
    return json.dumps({"scores": scores})


def embeddings_of(output: str) -> list[str]:
    """Each vector of an embedding job's output, in base64."""
    return list(json.loads(output)["embeddings"])


def floats(encoded: str) -> list[float]:
    """A base64 vector's numbers."""
    values = array("f", base64.b64decode(encoded))
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


def scores_of(output: str) -> list[float]:
    return [float(s) for s in json.loads(output)["scores"]]
