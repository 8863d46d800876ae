"""Embeddings and rerank through the one lane (issue 49): tiny random-weight models of each kind (tests/tiny_kinds.py)
served from one models file beside a chat model, by the real worker, through the official clients unchanged.

Each vector and score is the model's own forward pass on that input alone (mlx-vlm's model, called as its server
calls it), within 1e-4, however the worker packed it with other requests' inputs; a chat stream goes on meanwhile.
"""

from __future__ import annotations

import base64
import os
import signal
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from tasks.job import JobSpec, Pooled, new_job_id
from tasks.pooled import embeddings_of, floats
from tasks.settings import Settings
from tests.helpers import openai_chunks, wait_batch, wait_ended, wait_event
from tests.test_hostile_models import serve
from tests.test_openai_batches import by_custom_id, jsonl, submit
from tests.test_recovery import wait_for_worker
from tests.tiny_kinds import build_embedding, build_reranker

pytestmark = pytest.mark.timeout(300)

TEXTS = [
    "the queue keeps the gpu busy",
    "a job waits, starts, streams its tokens, then ends",
    "rerank me",
    "embeddings of many requests share one pass beside the batch " * 4,
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kinds")
    return {"embed": build_embedding(root / "embed"), "rerank": build_reranker(root / "rerank")}


@pytest.fixture
def settings(settings: Settings, folders: dict[str, Path], demo_model: Path, tmp_path: Path) -> Settings:
    """A chat model (the default), an embedding model and a reranker, in one models file."""
    tables = {
        "chat": {"path": str(demo_model), "default": True},
        "embedder": {"path": str(folders["embed"])},
        "reranker": {"path": str(folders["rerank"])},
    }
    return serve(settings.model_copy(update={"max_batch": 4}), tmp_path, **tables)[0]


@pytest.fixture
def served(settings: Settings, start_worker) -> Settings:  # type: ignore[no-untyped-def]
    start_worker(settings)
    return settings


@pytest.fixture(scope="module")
def reference(folders: dict[str, Path]) -> Any:
    """The models' own answers, one input alone (the model called as mlx-vlm's server calls it)."""
    import mlx.core as mx
    from mlx_vlm.embedding_loader import load_embedding_model
    from mlx_vlm.models.pooling import read_pooling_config
    from mlx_vlm.reranker_loader import load_sequence_classification_model
    from transformers import AutoTokenizer

    embedder = load_embedding_model(folders["embed"])
    embedder.pooling_config = read_pooling_config(folders["embed"])
    reranker = load_sequence_classification_model(folders["rerank"])
    tokenizers = {kind: AutoTokenizer.from_pretrained(folder) for kind, folder in folders.items()}

    class Reference:
        def embed(self, text: str | list[int]) -> np.ndarray:
            ids = tokenizers["embed"](text)["input_ids"] if isinstance(text, str) else text
            out = embedder(mx.array([ids]), attention_mask=mx.ones((1, len(ids)))).text_embeds
            return np.array(out[0])

        def score(self, query: str, document: str) -> float:
            encoded = tokenizers["rerank"](query, document, return_tensors="np")
            logits = reranker(**{k: mx.array(v) for k, v in encoded.items()})
            logit = float(np.array(getattr(logits, "logits", logits)).reshape(-1)[0])
            return 1 / (1 + np.exp(-logit))

    return Reference()


def test_the_openai_client_embeds_texts_as_the_model_does_alone(served, live_server, reference):
    from openai import OpenAI

    client = OpenAI(base_url=f"{live_server}/v1", api_key="unused", max_retries=0)
    # the SDK asks for base64 unless told otherwise, and decodes it: both encodings
    for encoding in ("base64", "float"):
        answer = client.embeddings.create(model="embedder", input=TEXTS, encoding_format=encoding)  # type: ignore[arg-type]
        vectors = [d.embedding for d in answer.data]
        if encoding == "base64":
            vectors = [np.frombuffer(base64.b64decode(v), dtype="<f4") for v in vectors]  # type: ignore[arg-type]
        assert [d.index for d in answer.data] == list(range(len(TEXTS)))
        for text, vector in zip(TEXTS, vectors):
            assert np.abs(np.array(vector) - reference.embed(text)).max() < 1e-4
        assert answer.usage.prompt_tokens == answer.usage.total_tokens > len(TEXTS)
    one = client.embeddings.create(model="embedder", input=TEXTS[0])
    assert len(one.data) == 1 and np.allclose(one.data[0].embedding, reference.embed(TEXTS[0]), atol=1e-4)


def test_token_ids_and_fewer_dimensions(served, live_server, reference):
    ids = [[5, 17, 300, 2000, 9], [7, 7]]
    for inputs, expected in ((ids, ids), (ids[0], ids[:1]), (TEXTS[1], TEXTS[1:2])):
        body = {"model": "embedder", "input": inputs, "dimensions": 16}
        answer = requests.post(f"{live_server}/v1/embeddings", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        got = [np.array(d["embedding"]) for d in answer.json()["data"]]
        assert len(got) == len(expected)
        for vector, one in zip(got, expected):
            full = reference.embed(one)
            cut = full[:16] / np.linalg.norm(full[:16])
            assert vector.shape == (16,) and np.abs(vector - cut).max() < 1e-4


def test_many_clients_inputs_share_passes_while_a_chat_streams(served, live_server, store, reference):
    # Given a chat answer streaming
    # (long enough to outlast 8 clients' embeddings on a loaded machine: 400 tokens did not, beside the whole suite)
    chat = {"model": "chat", "prompt": "once upon a time", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    texts: list[str] = []
    with requests.post(f"{live_server}/v1/completions", json=chat, stream=True, timeout=120) as stream:
        chunks = openai_chunks(stream)
        texts.append(next(chunks)["choices"][0]["text"])

        # When 8 clients ask for embeddings of 12 inputs each, at once
        answers: dict[int, Any] = {}

        def ask(n: int) -> None:
            inputs = [f"{TEXTS[(n + k) % len(TEXTS)]} {n} {k}" for k in range(12)]
            reply = requests.post(
                f"{live_server}/v1/embeddings", json={"model": "embedder", "input": inputs}, timeout=120
            )
            answers[n] = (inputs, reply)

        threads = [threading.Thread(target=ask, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        chat_id = stream.headers["x-onelane-job-id"]
        # Then they were answered while the chat still generated (the batch was not drained for them)
        assert store.get(chat_id).status.value == "in_progress"
        for chunk in chunks:
            texts.append(chunk["choices"][0]["text"] or "")
    assert store.get(chat_id).usage.completion_tokens == 3000
    # And every vector is the model's for its input alone
    for inputs, reply in answers.values():
        assert reply.status_code == 200, reply.text
        for text, data in zip(inputs, reply.json()["data"]):
            assert np.abs(np.array(data["embedding"]) - reference.embed(text)).max() < 1e-4


def test_rerank_scores_each_document_as_the_model_does_alone(served, live_server, reference):
    documents = TEXTS[1:] + ["the gpu"]
    body = {"model": "reranker", "query": TEXTS[0], "documents": documents, "top_n": 3, "return_documents": True}
    for path in ("/v1/rerank", "/v2/rerank"):
        answer = requests.post(f"{live_server}{path}", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        expected = [reference.score(TEXTS[0], d) for d in documents]
        best = sorted(range(len(documents)), key=lambda n: -expected[n])[:3]
        assert [r["index"] for r in results] == best
        for r in results:
            assert abs(r["relevance_score"] - expected[r["index"]]) < 1e-4
            assert r["document"] == {"text": documents[r["index"]]}


def test_langchain_embeds_through_onelane(served, live_server, reference):
    from langchain_openai import OpenAIEmbeddings

    # (check_embedding_ctx_length off: else it tokenizes with OpenAI's tiktoken and sends those ids, meaningless to
    # another model, as for any server not OpenAI's)
    embedder = OpenAIEmbeddings(
        model="embedder", base_url=f"{live_server}/v1", api_key="unused", check_embedding_ctx_length=False
    )
    vectors = embedder.embed_documents(TEXTS[:2])
    query = embedder.embed_query(TEXTS[2])
    for text, vector in zip(TEXTS, [*vectors, query]):
        assert np.abs(np.array(vector) - reference.embed(text)).max() < 1e-4


def test_each_kind_is_asked_of_its_own_endpoints_and_bad_inputs_are_refused(served, live_server, store):
    def post(path: str, body: dict[str, Any]) -> requests.Response:
        return requests.post(f"{live_server}{path}", json=body, timeout=60)

    refusals = [
        ("/v1/chat/completions", {"model": "embedder", "messages": [{"role": "user", "content": "hi"}]}, "model"),
        ("/v1/embeddings", {"model": "chat", "input": "hi"}, "model"),
        ("/v1/rerank", {"model": "embedder", "query": "q", "documents": ["d"]}, "model"),
        ("/v1/embeddings", {"model": "embedder", "input": ""}, None),
        ("/v1/embeddings", {"model": "embedder", "input": []}, None),
        ("/v1/embeddings", {"model": "embedder", "input": ["x"] * 2049}, None),
        ("/v1/embeddings", {"model": "embedder", "input": "x", "encoding_format": "int8"}, None),
        ("/v1/rerank", {"model": "reranker", "query": "q", "documents": []}, None),
        ("/v1/rerank", {"model": "reranker", "query": "q", "documents": [{"txt": "d"}]}, "documents"),
    ]
    for path, body, param in refusals:
        answer = post(path, body)
        assert answer.status_code == 400, (path, body, answer.text)
        assert "Traceback" not in answer.text and answer.json()["error"]["message"]
        if param:
            assert answer.json()["error"]["param"] == param, answer.text
    # found by the worker, which knows the model: a vector asked longer than it is, an input longer than it reads, a
    # token beyond its vocabulary
    for body, param in (
        ({"model": "embedder", "input": "hi", "dimensions": 65}, "dimensions"),
        ({"model": "embedder", "input": "word " * 1100}, "input"),
        ({"model": "embedder", "input": [[1, 2, 4096]]}, "input"),
    ):
        answer = post("/v1/embeddings", body)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == param, answer.text
    # /v1/models says what each is for
    kinds = {m["id"]: m["kind"] for m in requests.get(f"{live_server}/v1/models", timeout=10).json()["data"]}
    assert kinds == {"chat": "generate", "embedder": "embed", "reranker": "rerank"}


def test_a_batch_file_of_embedding_requests(served, client, store, reference):
    # Given a Batch API file whose lines ask /v1/embeddings, one of them for a model of another kind
    lines = [
        {"custom_id": f"e{n}", "method": "POST", "url": "/v1/embeddings", "body": {"model": "embedder", "input": t}}
        for n, t in enumerate(TEXTS)
    ]
    lines.append({**lines[0], "custom_id": "chat", "body": {"model": "chat", "input": "hi"}})
    batch = submit(client, jsonl(*lines), endpoint="/v1/embeddings")

    # When it runs, Then each good line's answer is the endpoint's, its vector the model's; the other names why not
    assert wait_batch(store, batch.id, timeout_s=120).status == "completed"
    final = client.batches.retrieve(batch.id)
    output, errors = by_custom_id(client, final.output_file_id), by_custom_id(client, final.error_file_id)
    for n, text in enumerate(TEXTS):
        body = output[f"e{n}"]["response"]["body"]
        assert (
            body["object"] == "list" and store.get(output[f"e{n}"]["response"]["request_id"]).spec.priority == "batch"
        )
        assert np.abs(np.array(body["data"][0]["embedding"]) - reference.embed(text)).max() < 1e-4
    assert (
        errors["chat"]["error"]["code"] == "invalid_request" and "text generator" in errors["chat"]["error"]["message"]
    )


def test_a_client_that_leaves_while_its_embeddings_wait_has_them_never_read(settings, live_server, store):
    # Given no worker yet: the job waits. When its client gives up, Then it is cancelled, never started
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(f"{live_server}/v1/embeddings", json={"model": "embedder", "input": TEXTS}, timeout=1)
    (job,) = store.list("local")
    left = wait_ended(store, job.id)
    assert (left["status"], left["error"]["type"], left["timings"]["started_at"]) == ("cancelled", "client_gone", None)


def test_a_worker_process_whose_first_model_is_an_embedding_model(
    settings, folders, tmp_path, worker_process, live_server, store, reference
):
    # Given `onelane worker` serving a models file whose first (default) model embeds: it loads that one at start
    _, env = serve(
        settings, tmp_path, embedder={"path": str(folders["embed"])}, chat={"path": settings.catalog[0].path}
    )
    worker_process(**env)
    # When a client asks for embeddings, Then they are the model's
    answer = requests.post(f"{live_server}/v1/embeddings", json={"model": "embedder", "input": TEXTS[:2]}, timeout=120)
    assert answer.status_code == 200, answer.text
    for text, data in zip(TEXTS, answer.json()["data"]):
        assert np.abs(np.array(data["embedding"]) - reference.embed(text)).max() < 1e-4


def test_a_worker_killed_while_it_reads_an_embedding_job_loses_nothing(
    settings, folders, tmp_path, worker_process, store, reference
):
    # Given `onelane worker` reading a long embedding job (512 inputs of ~130 tokens: seconds of passes, where the
    # kill comes milliseconds after it started)
    _, env = serve(settings, tmp_path, embedder={"path": str(folders["embed"])})
    worker_process(**env)
    wait_for_worker(store)
    texts = tuple(f"{n} " + " ".join(TEXTS) * 2 for n in range(512))
    spec = JobSpec(owner="u", model="embedder", pooled=Pooled(kind="embed", texts=texts))
    job_id = new_job_id()
    store.admit(job_id, spec, 300)
    wait_event(store, job_id, lambda e: e.type == "started", timeout_s=60)
    # When its worker is killed as it reads it (the one holding the device now, not necessarily the first)
    os.kill(wait_for_worker(store).pid, signal.SIGKILL)
    # Then the next worker reads it again from the start, and it completes once, every vector the model's
    done = wait_ended(store, job_id, timeout_s=240)
    assert (done["status"], done["attempts"]) == ("completed", 2), done.get("error")
    job = store.get(job_id)
    vectors = [floats(v) for v in embeddings_of(job.output)]
    assert len(vectors) == 512
    for n in (0, 300, 511):
        assert np.abs(np.array(vectors[n]) - reference.embed(texts[n])).max() < 1e-4
