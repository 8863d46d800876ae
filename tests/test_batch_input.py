"""A batch's input file, line by line: each line a job of the batch class checked as its endpoint checks a request,
or an error line with its custom_id; only a file with no JSON object at all is refused whole."""

from __future__ import annotations

import json

import pytest

from tasks.endpoints import ENDPOINTS
from web.openai.batches.input import NotJsonl, read_lines

CHAT = "/v1/chat/completions"


def line(custom_id, body=None, url=CHAT, method="POST"):  # type: ignore[no-untyped-def]
    body = body if body is not None else {"model": "onelane-demo", "messages": [{"role": "user", "content": "hi"}]}
    return json.dumps({"custom_id": custom_id, "method": method, "url": url, "body": body})


pytestmark = pytest.mark.default_catalog  # onelane-demo is one of its models


def test_good_lines_are_batch_jobs_nobody_watches_and_bad_ones_are_errors_with_their_custom_id(settings):
    data = "\n".join(
        [
            line("a"),
            line(
                "b",
                {
                    "model": "onelane-demo",
                    "messages": [{"role": "user", "content": "x"}],
                    "max_tokens": 5,
                    "service_tier": "priority",
                },
            ),
            "not json",
            line("a"),  # again
            line("c", url="/v1/embeddings"),
            line("d", url="/v1/completions"),  # another endpoint than the batch's
            line("e", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
            line("f", {"model": "onelane-demo", "messages": [], "tools": [{"type": "function"}]}),
            line("g", method="GET"),
            line("h", {"model": "onelane-demo", "messages": [{"role": "user", "content": "x"}], "stream": True}),
            json.dumps({"method": "POST", "url": CHAT, "body": {}}),
            "",
        ]
    ).encode()

    lines, errors = read_lines(data, CHAT, "alice", settings)

    assert [(line.index, line.custom_id) for line in lines] == [(0, "a"), (1, "b")]
    assert all(x.spec.priority == "batch" and not x.spec.watched and x.spec.owner == "alice" for x in lines)
    assert lines[1].spec.params.max_tokens == 5
    assert [(e.index, e.custom_id, e.code) for e in errors] == [
        (2, None, "invalid_json"),
        (3, "a", "duplicate_custom_id"),
        (4, "c", "invalid_url"),
        (5, "d", "invalid_url"),
        (6, "e", "model_not_found"),
        (7, "f", "invalid_request"),
        (8, "g", "invalid_method"),
        (9, "h", "invalid_body"),
        (10, None, "missing_custom_id"),
    ]
    assert "tools" in errors[5].message


def test_responses_lines_are_responses_and_completions_lines_completions(settings):
    body = {"model": "onelane-demo", "input": "hi", "instructions": "Be brief.", "background": True}
    (resp,), _ = read_lines(line("r", body, url="/v1/responses").encode(), "/v1/responses", "u", settings)
    assert resp.spec.response is not None and resp.spec.response.background is False and not resp.spec.watched
    assert resp.spec.messages[0].content == "Be brief."
    (text,), _ = read_lines(
        line("t", {"model": "onelane-demo", "prompt": "Once"}, url="/v1/completions").encode(),
        "/v1/completions",
        "u",
        settings,
    )
    assert text.spec.prompt == "Once" and text.spec.params.max_tokens == 16


def test_a_responses_line_cannot_continue_another_response(settings):
    body = {"model": "onelane-demo", "input": "and then?", "previous_response_id": "resp_x"}
    lines, (error,) = read_lines(line("r", body, url="/v1/responses").encode(), "/v1/responses", "u", settings)
    assert lines == [] and (error.code, error.custom_id) == ("invalid_request", "r")
    assert "previous_response_id" in error.message


@pytest.mark.parametrize("data", [b"not json\nat all\n", b"[1, 2]\n\n", b"\n\n"])
def test_a_file_with_no_json_object_is_refused_whole(settings, data):
    with pytest.raises(NotJsonl):
        read_lines(data, CHAT, "u", settings)


#: a body each endpoint of a batch answers (tasks/endpoints.py), to the model it takes
BODIES = {
    "/v1/chat/completions": {"model": "onelane-demo", "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": "onelane-demo", "prompt": "hi"},
    "/v1/responses": {"model": "onelane-demo", "input": "hi"},
    "/v1/embeddings": {"model": "embedder", "input": "hi"},
}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_line_to_each_endpoint_a_batch_may_address_is_read_as_its_job(settings, demo_model, tmp_path, endpoint):
    from tests.test_hostile_models import serve
    from tests.tiny_kinds import build_embedding

    # Given a text generator and an embedding model
    embedder = build_embedding(tmp_path / "embed")
    served = serve(
        settings, tmp_path, **{"onelane-demo": {"path": str(demo_model)}, "embedder": {"path": str(embedder)}}
    )

    # When a batch of that endpoint reads a line addressed to it
    lines, errors = read_lines(line("a", BODIES[endpoint], url=endpoint).encode(), endpoint, "u", served[0])

    # Then the line is a job of the batch
    assert (errors, [x.custom_id for x in lines]) == ([], ["a"])
