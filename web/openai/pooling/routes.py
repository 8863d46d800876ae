"""Embeddings and rerank on the queue: /v1/embeddings (OpenAI's shape), /v1/rerank and /v2/rerank (the shape vLLM,
llama.cpp, Jina and Cohere clients send: `query`, `documents`, `top_n`; results with `index` and
`relevance_score`).

Each request is one job of an embedding model or a reranker, in the same queue as every other (fairness, quotas,
TTL, a client that hangs up has it cancelled). The worker reads it beside the running batch, its inputs in one
forward pass with other requests' (worker/pooling.py); nothing is generated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from flask import Blueprint, Response, jsonify, request
from pydantic import BaseModel, Field, model_validator

from tasks.errors import InvalidRequest
from tasks.job import Job, JobSpec, Pooled
from tasks.pooled import embeddings_of, floats, scores_of
from tasks.settings import Settings
from web.admission import run_one
from web.apidoc import View, documented, reply
from web.auth import current_owner
from web.openai.schemas import NEUTRAL, STRICT
from web.requests import REQUEST_ERRORS, parse_strict
from web.responses import Answer
from web.schemas import json_body, make_pooled_spec
from web.services import services

bp = Blueprint("pooling", __name__)

INPUTS_MOST = 2048  # inputs in one embeddings request (OpenAI's bound), documents in one rerank request


class EmbeddingRequest(BaseModel):
    model_config = STRICT

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="a text, a list of texts, or token ids (a list, or a list of lists) of the model's tokenizer; "
        f"at most {INPUTS_MOST} inputs, none empty"
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="`base64`: each vector's little-endian float32 bytes, in base64"
    )
    dimensions: int | None = Field(
        None, ge=1, description="the first this many numbers of each vector, normalized again (Matryoshka-trained "
        "models, such as Qwen3-Embedding); at most the model's own"
    )  # fmt: skip
    user: str | None = None

    @model_validator(mode="after")
    def _inputs(self) -> EmbeddingRequest:
        self.pooled()
        return self

    def pooled(self) -> Pooled:
        raw: list[Any] = [self.input] if isinstance(self.input, str) else list(self.input)
        if raw and all(isinstance(i, int) for i in raw):
            raw = [raw]  # one input as token ids
        if not raw:
            raise ValueError("`input` holds no input")
        if len(raw) > INPUTS_MOST:
            raise ValueError(f"`input` holds {len(raw)} inputs; at most {INPUTS_MOST}")
        if any(len(i) == 0 for i in raw):
            raise ValueError("`input` holds an empty input")
        if any(isinstance(i, list) and any(t < 0 for t in i) for i in raw):
            raise ValueError("`input` holds a negative token id")
        texts = tuple(i if isinstance(i, str) else tuple(i) for i in raw)
        return Pooled(kind="embed", texts=texts, dimensions=self.dimensions, encoding=self.encoding_format)

    def admission(self, owner: str, settings: Settings, batch: bool = False) -> tuple[JobSpec, float]:
        """Its job (a batch's line: batch class, nobody watching) and its TTL."""
        return make_pooled_spec(owner, settings, self.pooled(), self.model, batch=batch)


class RerankRequest(BaseModel):
    model_config = STRICT

    model: str | None = None
    query: str = Field(min_length=1)
    documents: list[str | dict[str, str]] = Field(
        min_length=1, max_length=INPUTS_MOST, description='texts, or objects `{"text": …}` (as Cohere\'s)'
    )
    top_n: int | None = Field(None, ge=1, description="only the best this many results (default: all)")
    return_documents: bool = Field(False, description="each result carries its document")
    user: str | None = None

    def texts(self) -> tuple[str, ...]:
        texts = []
        for n, document in enumerate(self.documents):
            text = document if isinstance(document, str) else document.get("text")
            if not isinstance(text, str) or set(document if isinstance(document, dict) else ()) - {"text"}:
                raise InvalidRequest(f"documents[{n}] must be a text, or an object with `text` only", param="documents")
            if not text:
                raise InvalidRequest(f"documents[{n}] is empty", param="documents")
            texts.append(text)
        return tuple(texts)


class Embedding(Answer):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(description="its numbers, or (`base64`) their float32 bytes in base64")


class PoolingUsage(Answer):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(Answer):
    """One vector per input, in the inputs' order."""

    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: PoolingUsage


class RerankDocument(Answer):
    text: str


class RerankResult(Answer):
    index: int = Field(description="the document's place in `documents`")
    relevance_score: float = Field(description="in [0, 1]: the reranker's logit through a sigmoid")
    document: RerankDocument | None = None


class RerankList(Answer):
    """The documents best first (ties in their order), `top_n` of them if asked."""

    id: str
    model: str
    results: list[RerankResult]
    usage: PoolingUsage


@bp.post("/v1/embeddings")
@documented(
    "createEmbedding",
    "Create embeddings",
    "openai",
    description="A job in the same queue, for an embedding model (one whose folder pools: sentence-transformers' "
    "`modules.json`), read beside the running batch with other requests' inputs; a client that hangs up gets it "
    "cancelled. An input longer than the model takes is refused, not cut.",
    body=EmbeddingRequest,
    answers={200: reply("the vectors", EmbeddingList)},
    errors=REQUEST_ERRORS,
)
def embeddings() -> Response:
    owner = current_owner()
    req: EmbeddingRequest = parse_strict(EmbeddingRequest, json_body(request), NEUTRAL)
    job = run_one(req.admission(owner, services().settings), "input")
    return _answer(job, embeddings_body(job))


def embeddings_body(job: Job) -> dict[str, Any]:
    """What /v1/embeddings answers for a completed embedding job (a batch's line too)."""
    assert job.spec.pooled is not None
    base64 = job.spec.pooled.encoding == "base64"
    data = [
        {"object": "embedding", "index": n, "embedding": v if base64 else floats(v)}
        for n, v in enumerate(embeddings_of(job.output))
    ]
    return {"object": "list", "data": data, "model": job.spec.model, "usage": _usage(job)}


def _documented_rerank(operation_id: str, summary: str) -> Callable[[View], View]:
    return documented(
        operation_id,
        summary,
        "openai",
        description="A job in the same queue, for a reranker (a cross-encoder: its config names a "
        "`…ForSequenceClassification`), each (query, document) pair scored beside the running batch; a client that "
        "hangs up gets it cancelled.",
        body=RerankRequest,
        answers={200: reply("the documents, best first", RerankList)},
        errors=REQUEST_ERRORS,
    )


@bp.post("/v1/rerank")
@_documented_rerank("createRerank", "Rerank documents")
def rerank() -> Response:
    return _rerank()


@bp.post("/v2/rerank")
@_documented_rerank("createRerankV2", "Rerank documents (the path Cohere's v2 clients call)")
def rerank_v2() -> Response:
    return _rerank()


def _rerank() -> Response:
    owner = current_owner()
    req: RerankRequest = parse_strict(RerankRequest, json_body(request), NEUTRAL)
    pooled = Pooled(kind="rerank", texts=req.texts(), query=req.query)
    job = run_one(make_pooled_spec(owner, services().settings, pooled, req.model), "documents")
    scores = scores_of(job.output)
    order = sorted(range(len(scores)), key=lambda n: (-scores[n], n))[: req.top_n]
    results = [
        {
            "index": n,
            "relevance_score": scores[n],
            **({"document": {"text": pooled.texts[n]}} if req.return_documents else {}),
        }
        for n in order
    ]
    body = {"id": f"rerank-{job.id}", "model": job.spec.model, "results": results, "usage": _usage(job)}
    return _answer(job, body)


def _usage(job: Job) -> dict[str, int]:
    return {"prompt_tokens": job.usage.prompt_tokens, "total_tokens": job.usage.prompt_tokens}


def _answer(job: Job, body: dict[str, Any]) -> Response:
    response = jsonify(body)
    response.headers["x-onelane-job-id"] = job.id
    if job.timings.started_at is not None:
        response.headers["x-queue-time"] = f"{job.timings.started_at - job.timings.queued_at:.3f}"
    return response
