"""OpenAI's Batch API on the queue: /v1/batches (create, retrieve, list, cancel).

A batch runs an uploaded JSONL file (/v1/files, purpose `batch`) against one endpoint. Its lines are read and checked
here, as the endpoint checks a request (web/openai/batches/input.py); a line that cannot run is an error line at once,
and the rest become batch-class jobs as the queue drains (web/openai/batches/runner.py). Its status:

    in_progress -> finalizing -> completed     (every line has its result, in the output or the error file)
    in_progress -> cancelling -> cancelled     (POST .../cancel: what completed is kept, the rest are error lines)
    in_progress -> expired                     (its window ended: likewise)
    failed                                     (the file holds no JSON object at all; nothing ran)

A batch is validated as it is created, so it is never seen `validating`. request_counts: `completed` counts the
output file's lines, `failed` the error file's, `total` every line.
"""

from __future__ import annotations

import time
from typing import Literal

from flask import Blueprint, Response, jsonify, request
from pydantic import BaseModel, Field, field_validator

from tasks.batches import BatchRecord, PendingLine, new_batch_id
from tasks.endpoints import Endpoint
from tasks.errors import (
    BatchNotFound,
    FileNotFound,
    Forbidden,
    InvalidJSON,
    InvalidParameter,
    InvalidRequest,
    Unauthorized,
    Unavailable,
)
from web.apidoc import documented, reply
from web.auth import current_owner
from web.limits import LIMIT, LIST_LIMIT_MAX, after, list_limit
from web.openai.batches.answers import Batch, BatchList
from web.openai.batches.input import NotJsonl, TooManyLines, read_lines
from web.openai.batches.runner import batch_runner, refused_line
from web.openai.body import list_page
from web.openai.schemas import NEUTRAL, STRICT, bounded_metadata
from web.requests import parse_strict
from web.schemas import json_body
from web.services import services

bp = Blueprint("batches", __name__)


class ExpiresAfter(BaseModel):
    """How long a batch's output and error files are kept: `seconds` after each is written (its `created_at`)."""

    model_config = STRICT

    anchor: Literal["created_at"] = Field(description="the file's creation, as OpenAI's (not the batch's)")
    seconds: int = Field(ge=3600, le=2_592_000, description="1 hour to 30 days")


class BatchRequest(BaseModel):
    """POST /v1/batches: run every request of an uploaded JSONL file (purpose `batch`) against one endpoint."""

    model_config = STRICT

    input_file_id: str = Field(max_length=256)
    endpoint: Endpoint
    completion_window: Literal["24h"] = Field(description="the only window: ONELANE_BATCH_WINDOW seconds (24 h)")
    metadata: dict[str, str] | None = Field(
        None, description="up to 16 pairs, echoed back", json_schema_extra={"maxProperties": 16}
    )
    output_expires_after: ExpiresAfter | None = Field(
        None, description="how long the output and error files are kept (default: ONELANE_FILE_RETENTION)"
    )

    _bounded_metadata = field_validator("metadata")(bounded_metadata)


@bp.post("/v1/batches")
@documented(
    "createBatch",
    "Run an uploaded file's requests (Batch API)",
    "openai",
    description=lambda s: (
        "Each line of the file (`purpose=batch`) is checked as its endpoint checks a request; a line that cannot run "
        "is an error line at once (with its custom_id), the others run as batch-class jobs, at most "
        f"{s.batch_waiting} waiting at once (fed as the queue drains, outside the owner's quota). The window is "
        f"{s.batch_window_s:g} s; a file with no JSON object makes a `failed` batch."
    ),
    body=BatchRequest,
    answers={200: reply("the batch, in_progress (or already ended)", Batch)},
    errors=[
        InvalidJSON,
        (InvalidRequest, "an unknown endpoint or window, an input file of another purpose, named in `param`"),
        (TooManyLines, lambda s: f"this server's is {s.max_batch_lines}"),
        Unauthorized,
        Forbidden,
        (FileNotFound, "no such input file"),
        Unavailable,
    ],
)
def create() -> Response:
    owner = current_owner()
    req: BatchRequest = parse_strict(BatchRequest, json_body(request), NEUTRAL)
    svc = services()
    settings = svc.settings
    try:
        source = svc.files.get(req.input_file_id, owner)
    except FileNotFound:
        raise FileNotFound(f"no file {req.input_file_id!r}", param="input_file_id") from None
    if source.purpose != "batch":
        raise InvalidRequest("the input file's purpose must be `batch`", param="input_file_id")
    data = svc.files.content(source.id, owner)
    now, bid = int(time.time()), new_batch_id()
    record = BatchRecord(
        id=bid,
        owner=owner,
        endpoint=req.endpoint,
        input_file_id=source.id,
        status="in_progress",
        created_at=now,
        in_progress_at=now,
        expires_at=now + int(settings.batch_window_s),
        metadata=req.metadata,
        output_keep_s=req.output_expires_after.seconds if req.output_expires_after else None,
    )
    try:
        lines, refused = read_lines(data, req.endpoint, owner, settings)
    except NotJsonl as exc:
        error = {"code": exc.type, "message": exc.message, "param": None, "line": None}
        record = record.model_copy(
            update={"status": "failed", "in_progress_at": None, "failed_at": now, "errors": [error]}
        )
        svc.batches.create(record, [], [])
        return jsonify(Batch.of(svc.batches.get(bid, owner)))
    total = len(lines) + len(refused)  # (at most ONELANE_MAX_BATCH_LINES: read_lines refuses more)
    pending = [PendingLine(line.index, line.custom_id, line.spec_json) for line in lines]
    errors = [refused_line(bid, e.index, e.custom_id, e.code, e.message) for e in refused]
    svc.batches.create(record.model_copy(update={"total": total}), pending, errors)
    batch_runner().run(bid)  # its first lines in the queue now
    return jsonify(Batch.of(svc.batches.get(bid, owner)))


@bp.get("/v1/batches")
@documented(
    "listBatches",
    "List the caller's batches",
    "openai",
    params=[LIMIT, after("list those older than this batch")],
    answers={200: reply("the batches", BatchList)},
    errors=[(InvalidParameter, f"`limit` is not a whole number from 1 to {LIST_LIMIT_MAX}"), Unauthorized, Unavailable],
)
def list_batches() -> Response:
    records, more = services().batches.list(current_owner(), list_limit(), request.args.get("after"))
    return jsonify(list_page([Batch.of(r) for r in records], more))


@bp.get("/v1/batches/<batch_id>")
@documented(
    "getBatch",
    "Get a batch, with its request counts",
    "openai",
    answers={200: reply("the batch", Batch)},
    errors=[Unauthorized, BatchNotFound, Unavailable],
)
def retrieve(batch_id: str) -> Response:
    return jsonify(Batch.of(services().batches.get(batch_id, current_owner())))


@bp.post("/v1/batches/<batch_id>/cancel")
@documented(
    "cancelBatch",
    "Cancel a batch, keeping what completed",
    "openai",
    description="`cancelling`, then `cancelled`: what runs stops within a step, what waits never runs; each line not "
    "answered goes to the error file (`batch_cancelled`). Again, or once it ended: the batch as it is.",
    answers={200: reply("the batch", Batch)},
    errors=[Unauthorized, Forbidden, BatchNotFound, Unavailable],
)
def cancel(batch_id: str) -> Response:
    svc = services()
    cancelled = svc.batches.cancel(batch_id, current_owner())
    batch_runner().run(batch_id)  # what waits is cancelled now
    return jsonify(Batch.of(svc.batches.get(batch_id, cancelled.owner)))
