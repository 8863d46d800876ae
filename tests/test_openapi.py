"""/openapi.json is valid OpenAPI 3.1, generated from the models the handlers validate with; /docs renders it; and
the app keeps the promises the document makes (schemathesis fuzzes every operation against it).

No worker runs: a canceller thread (a client who cancels each job the moment it is admitted) ends every job, so
the OpenAI endpoints, which wait for their job, answer at once (410 job_cancelled, or a stream that ends).
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
import schemathesis
from flask import Flask
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis.stateful import run_state_machine_as_test
from openapi_spec_validator import OpenAPIV31SpecValidator
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tasks.catalogue import DEFAULT_MODEL
from tasks.errors import JobNotFound, Unavailable
from tasks.settings import Settings
from tests.helpers import wait_ended
from web import openapi
from web.errors import meaning
from web.openai.chat.schemas import ChatRequest, CompletionRequest
from web.schemas import SubmitJob

OPERATIONS = {
    ("/v1/jobs", "post"), ("/v1/jobs", "get"), ("/v1/jobs/{job_id}", "get"), ("/v1/jobs/{job_id}", "delete"),
    ("/v1/jobs/{job_id}/events", "get"), ("/v1/models", "get"), ("/v1/chat/completions", "post"),
    ("/v1/completions", "post"), ("/healthz", "get"), ("/readyz", "get"), ("/metrics", "get"),
    ("/", "get"), ("/jobs", "post"), ("/jobs/{job_id}", "get"), ("/jobs/{job_id}/continue", "post"), ("/jobs/{job_id}/images/{digest}", "get"), ("/jobs", "get"),
    ("/login", "get"), ("/login", "post"),
    ("/queue", "get"), ("/queue.json", "get"), ("/queue/jobs/{job_id}/cancel", "post"), ("/openapi.json", "get"),
    ("/docs", "get"), ("/v1/responses", "post"), ("/v1/responses/{rid}", "get"), ("/v1/responses/{rid}/cancel", "post"),
    ("/v1/responses/{rid}/input_items", "get"),
    ("/v1/files", "post"), ("/v1/files", "get"), ("/v1/files/{file_id}", "get"), ("/v1/files/{file_id}/content", "get"),
    ("/v1/files/{file_id}", "delete"),
    ("/v1/batches", "post"), ("/v1/batches", "get"), ("/v1/batches/{batch_id}", "get"),
    ("/v1/batches/{batch_id}/cancel", "post"), ("/v1/embeddings", "post"), ("/v1/rerank", "post"), ("/v1/messages", "post"),
    ("/v1/messages/count_tokens", "post"),
    ("/v2/rerank", "post"),
}  # fmt: skip
TAKE_INPUT = {("/v1/jobs", "post"), ("/v1/jobs", "get"), ("/v1/chat/completions", "post"), ("/v1/completions", "post"),
              ("/jobs", "post"), ("/login", "post"), ("/v1/responses", "post"), ("/v1/batches", "post"),
              ("/v1/embeddings", "post"), ("/v1/rerank", "post")}  # fmt: skip
MODEL = "onelane-demo"
EXAMPLES = 40  # per operation (and per mode, or scenarios): the whole file runs in well under a minute
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
SENT: Counter[str] = Counter()  # requests schemathesis sent, by operation
# schemathesis stops reading an event stream after 10 s in all by default (and calls it cut short): a worker's story
# reads each stream to its end, which a loaded machine has delayed past that, so it gives its calls this bound instead
STREAM_S = 120


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # local mode (no keys), the demo model's name, and bounds no fuzzed request reaches
    return settings.model_copy(update={"model": None, "max_queue": 10**6, "max_queued_per_user": 10**6})


def test_openapi_json_is_valid_openapi_3_1_with_every_operation(app) -> None:  # type: ignore[no-untyped-def]
    response = app.test_client().get("/openapi.json")

    assert response.status_code == 200
    spec = response.get_json()
    assert re.fullmatch(r"3\.1\.\d+", spec["openapi"])
    OpenAPIV31SpecValidator(spec).validate()
    assert {(path, method) for path, item in spec["paths"].items() for method in item} == OPERATIONS
    assert spec["components"]["securitySchemes"]["bearerAuth"] == {
        **spec["components"]["securitySchemes"]["bearerAuth"],
        "type": "http",
        "scheme": "bearer",
    }
    submit = spec["paths"]["/v1/jobs"]["post"]["responses"]
    assert {"202", "400", "401", "403", "404", "413", "422", "429", "503"} <= set(submit)
    assert submit["429"]["headers"]["Retry-After"]["required"] is True


def test_the_document_describes_every_route_the_app_serves_and_no_other(app) -> None:  # type: ignore[no-untyped-def]
    # Given the app's own URL map (but its static files), When it is compared with the document, Then every route and
    # method is an operation, and every operation a route: a new route cannot be left out
    spec = app.test_client().get("/openapi.json").get_json()
    documented = {(path, method) for path, item in spec["paths"].items() for method in item}
    routed = {
        (re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule), method.lower())
        for rule in app.url_map.iter_rules()
        if rule.endpoint != "static"
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    assert routed - documented == set(), "routes missing from /openapi.json"
    assert documented - routed == set(), "operations no route serves"


def test_a_route_that_declares_no_operation_fails_the_document(settings: Settings) -> None:
    # Given an app with a route whose view declares nothing, When its document is built, Then it fails, naming the
    # route: a new route cannot be forgotten by the document
    app = Flask(__name__)
    app.add_url_rule("/undeclared", "undeclared", lambda: "")
    with pytest.raises(LookupError, match="/undeclared"):
        openapi.build(app, settings)


def test_each_error_is_documented_from_its_class_as_its_handler_answers_it(app) -> None:  # type: ignore[no-untyped-def]
    # Given the document, When a route's errors are read, Then each is its class's type and meaning, at the status
    # and with the headers the error handler answers it with
    responses = app.test_client().get("/openapi.json").get_json()["paths"]["/v1/jobs/{job_id}"]["get"]["responses"]
    assert responses["404"]["description"] == f"`{JobNotFound.type}`: {meaning(JobNotFound)}"
    assert responses["503"]["description"] == f"`{Unavailable.type}`: {meaning(Unavailable)}"
    assert responses["503"]["headers"]["Retry-After"]["required"] is True


def test_the_list_limit_is_documented_with_its_type_and_range(app) -> None:  # type: ignore[no-untyped-def]
    operation = app.test_client().get("/openapi.json").get_json()["paths"]["/v1/jobs"]["get"]
    (limit,) = [p for p in operation["parameters"] if p["name"] == "limit"]
    assert limit["in"] == "query"
    assert limit["schema"] == {"type": "integer", "minimum": 1, "maximum": 200, "default": 50}
    assert "400" in operation["responses"]


def test_request_schemas_are_the_handlers_own_models_with_this_servers_limits(app) -> None:  # type: ignore[no-untyped-def]
    # Given the document, When its request schemas are compared with the models' own JSON schemas, Then they are the
    # same, but for what this server's settings decide: the models it serves, and its limits
    schemas = app.test_client().get("/openapi.json").get_json()["components"]["schemas"]
    for model in (SubmitJob, ChatRequest, CompletionRequest):
        own, documented = model.model_json_schema(ref_template="#/components/schemas/{model}"), schemas[model.__name__]
        assert documented["additionalProperties"] is False  # unknown fields are refused
        assert set(documented["properties"]) == set(own["properties"])
        for field, schema in own["properties"].items():
            if field not in ("model", "prompt", "max_tokens", "max_completion_tokens", "ttl_s"):
                assert documented["properties"][field] == schema, field
        model_field = documented["properties"]["model"]
        assert [DEFAULT_MODEL, MODEL] in [branch.get("enum") for branch in model_field.get("anyOf", [model_field])]
    assert {"type": "number", "maximum": 600.0}.items() <= schemas["SubmitJob"]["properties"]["ttl_s"]["anyOf"][
        0
    ].items()


def test_docs_page_lists_every_operation_and_schema(app) -> None:  # type: ignore[no-untyped-def]
    response = app.test_client().get("/docs")

    assert response.status_code == 200
    page = response.get_data(as_text=True)
    for path, method in OPERATIONS:
        assert f'<span class="method">{method.upper()}</span> <code>{path}</code>' in page
    for name in ("SubmitJob", "Job", "Error", "ChatRequest", "ChatCompletion", "OpenAIError"):
        assert f'id="schema-{name}"' in page
    assert "Retry-After" in page and "Bearer" in page
    # offline and within the pages' CSP: nothing from another origin
    assert "default-src 'self'" in response.headers["Content-Security-Policy"]
    assert not re.search(r'(src|href)="(https?:)?//', page)


def test_the_docs_page_runs_no_script_while_the_other_pages_keep_theirs(app) -> None:  # type: ignore[no-untyped-def]
    # As the README promises: /docs is rendered on the server and needs no script (app.js serves job pages and times)
    client = app.test_client()
    assert re.findall(r"<script\b", client.get("/docs").get_data(as_text=True)) == []
    assert '<script src="/static/app.js" defer>' in client.get("/").get_data(as_text=True)


def test_with_api_keys_the_document_is_for_users(settings, make_app) -> None:  # type: ignore[no-untyped-def]
    # Given API keys (the document names the served models, as /v1/models does for users only)
    keyed = settings.model_copy(update={"users": settings.model_validate({"users": "alice:k1"}).users})
    client = make_app(keyed).test_client()

    # Then a caller without a key gets 401 and a browser the sign-in page; a key opens both
    assert client.get("/openapi.json").status_code == 401
    assert client.get("/docs").headers["Location"].endswith("/login")
    assert client.get("/openapi.json", headers={"Authorization": "Bearer k1"}).status_code == 200
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/login").get_data(as_text=True)).group(1)
    assert client.post("/login", data={"key": "k1", "csrf_token": token}).status_code == 303
    assert client.get("/docs").status_code == 200


# The event stream follows a job until it ends (its own tests cover it); every other operation is fuzzed, and those
# that take a body or a typed parameter also with requests that break the document (negative).
FUZZED = [
    (path, method, mode)
    for path, method in sorted(OPERATIONS - {("/v1/jobs/{job_id}/events", "get")})
    for mode in GenerationMode
    if mode == GenerationMode.POSITIVE or (path, method) in TAKE_INPUT
]


@pytest.mark.parametrize(("path", "method", "mode"), FUZZED)
def test_every_answer_keeps_the_documents_promises(
    app,
    canceller,
    path: str,
    method: str,  # type: ignore[no-untyped-def]
    mode: GenerationMode,
) -> None:
    # Given requests that fit the document (positive) or break it (negative), When each is sent to the app, Then no
    # 5xx (but /readyz's 503: no worker runs here), and every status, content type, header and body is documented
    operation = schemathesis.openapi.from_wsgi("/openapi.json", app)[path][method.upper()]
    checks = [c for c in CHECKS if not (path == "/readyz" and c is not_a_server_error)]

    @given(case=operation.as_strategy(generation_mode=mode))
    @hypothesis_settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def fuzz(case) -> None:  # type: ignore[no-untyped-def]
        response = case.call_and_validate(checks=checks)
        SENT[f"{method.upper()} {path} ({mode.value})"] += 1
        SENT[str(response.status_code)] += 1

    fuzz()


def test_scenarios_along_the_documents_links_keep_its_promises(app, canceller) -> None:  # type: ignore[no-untyped-def]
    # Given the document's links (submit -> get, cancel), When schemathesis chains calls with the ids the API gave
    # back, Then every answer conforms: real jobs polled and cancelled, not only ids that do not exist
    schema = schemathesis.openapi.from_wsgi("/openapi.json", app).exclude(operation_id=["jobEvents", "readyz"])

    class Scenarios(schema.as_state_machine()):  # type: ignore[misc]
        def validate_response(self, response, case, additional_checks=None, **kwargs) -> None:  # type: ignore[no-untyped-def]
            SENT[f"{case.operation.label} (stateful)"] += 1
            SENT[str(response.status_code)] += 1
            case.validate_response(response, checks=CHECKS)

    run_state_machine_as_test(
        Scenarios,
        settings=hypothesis_settings(
            max_examples=EXAMPLES,
            stateful_step_count=5,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


def test_a_real_workers_answers_keep_the_documents_promises(app, start_worker) -> None:  # type: ignore[no-untyped-def]
    # Given a worker, When jobs complete through each way in, whole and streamed (with several answers, log
    # probabilities, echo), Then their answers (which no fuzzing above reaches without one) conform too, down to
    # each event of each stream
    start_worker()
    schema = schemathesis.openapi.from_wsgi("/openapi.json", app)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    text = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    scored = {"logprobs": True, "top_logprobs": 2, "n": 2}
    response = {"model": MODEL, "input": "hi", "max_output_tokens": 4, "include": ["message.output_text.logprobs"]}
    for path, body in [
        ("/v1/chat/completions", chat),
        ("/v1/chat/completions", {**chat, **usage}),
        ("/v1/chat/completions", {**chat, **scored}),
        ("/v1/chat/completions", {**chat, **scored, **usage}),
        ("/v1/completions", text),
        ("/v1/completions", {**text, **usage}),
        ("/v1/completions", {**text, "logprobs": 2, "echo": True, "n": 2}),
        ("/v1/completions", {**text, "logprobs": 0, "echo": True, **usage}),
        ("/v1/completions", {**text, "echo": True, "max_tokens": 0, "logprobs": 1}),
        ("/v1/completions", {**text, "best_of": 2}),
        ("/v1/responses", {**response, "top_logprobs": 2}),
        ("/v1/responses", {**response, "stream": True}),
        ("/v1/jobs", {"prompt": "hi", "max_tokens": 4}),
    ]:
        response = schema[path]["POST"].Case(body=body).call_and_validate(checks=CHECKS, timeout=STREAM_S)
        assert response.status_code in (200, 202) and not response.stream_cut_short, response.text
    job_id = response.json()["id"]
    wait_ended(app.extensions["onelane"].store, job_id)
    for path in ("/v1/jobs/{job_id}", "/v1/jobs/{job_id}/events"):  # the stream replays the whole log, then ends
        answer = schema[path]["GET"].Case(path_parameters={"job_id": job_id}).call_and_validate(checks=CHECKS)
        assert answer.status_code == 200 and b"completed" in answer.content and not answer.stream_cut_short
    for path in ("/v1/jobs", "/v1/models", "/readyz"):
        assert schema[path]["GET"].Case().call_and_validate(checks=CHECKS).status_code == 200


def test_zz_report_how_many_requests_were_sent() -> None:
    """Printed for the record (pytest -s, or -rP): how many requests schemathesis sent, by operation and status."""
    statuses = {k: n for k, n in SENT.items() if k.isdigit()}
    operations = ", ".join(f"{k}: {n}" for k, n in sorted(SENT.items()) if not k.isdigit())
    print(f"schemathesis: {sum(statuses.values())} requests; by status {dict(sorted(statuses.items()))}; {operations}")
