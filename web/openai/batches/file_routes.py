"""OpenAI's Files API, for the Batch API's input: upload a JSONL file (`purpose=batch`), read it back, list, delete.

Files live in Redis (tasks/files.py), kept ONELANE_FILE_RETENTION, at most ONELANE_MAX_FILE_BYTES each (a larger
upload is 413 before it is read whole). Each owner sees only their own, listed a page at a time as OpenAI lists them
(`limit`, `after`, `order`, `purpose`).
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request
from werkzeug.exceptions import RequestEntityTooLarge

from tasks.errors import FileNotFound, Forbidden, InvalidParameter, InvalidRequest, Unauthorized, Unavailable
from web.apidoc import MULTIPART, documented, reply
from web.auth import current_owner
from web.limits import LIMIT, ORDER, after, list_limit, oldest_first
from web.openai.batches.answers import FileDeleted, FileList, FileObject
from web.openai.body import list_page
from web.services import services

bp = Blueprint("files", __name__)

PURPOSES = ("batch",)  # what onelane reads files for
FORM_SLACK = 64 * 1024  # the multipart framing and the `purpose` field around the file
UPLOAD = {
    "type": "object",
    "required": ["file", "purpose"],
    "properties": {
        "file": {"type": "string", "contentMediaType": "application/octet-stream"},
        "purpose": {"type": "string", "enum": list(PURPOSES)},
    },
}


@bp.post("/v1/files")
@documented(
    "createFile",
    "Upload a file (for the Batch API)",
    "openai",
    description=lambda s: (
        f"multipart/form-data: `file` (UTF-8 JSONL, at most {s.max_file_bytes} bytes) and `purpose` "
        f"(`batch`); kept {s.file_retention_s} s."
    ),
    body=UPLOAD,
    body_media=MULTIPART,
    answers={200: reply("the file", FileObject)},
    errors=[
        (InvalidRequest, "another purpose, no file, an empty file, or not UTF-8 text"),
        Unauthorized,
        Forbidden,
        (RequestEntityTooLarge, "the file is over ONELANE_MAX_FILE_BYTES"),
        Unavailable,
    ],
)
def upload() -> Response:
    settings = services().settings
    request.max_content_length = settings.max_file_bytes + FORM_SLACK  # before anything reads the body
    owner = current_owner()
    purpose = request.form.get("purpose", "")
    if purpose not in PURPOSES:
        raise InvalidRequest(f"purpose must be one of: {', '.join(PURPOSES)}", param="purpose")
    sent = request.files.get("file")
    if sent is None:
        raise InvalidRequest("the form has no `file` part", param="file")
    data = sent.read(settings.max_file_bytes + 1)
    if len(data) > settings.max_file_bytes:
        raise RequestEntityTooLarge()
    if not data.strip():
        raise InvalidRequest("the file is empty", param="file")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest("the file is not UTF-8 text (a JSONL file is)", param="file") from None
    filename = (sent.filename or "upload.jsonl")[:256]
    return jsonify(FileObject.of(services().files.create(owner, filename, purpose, data)))


@bp.get("/v1/files")
@documented(
    "listFiles",
    "List the caller's files",
    "openai",
    description="A page at a time: `has_more` says whether another follows, from `after` = this page's `last_id`.",
    params=[
        LIMIT,
        ORDER,
        after("list those after this file, in the order asked"),
        {
            "name": "purpose",
            "in": "query",
            "schema": {"type": "string"},
            "description": "only files of this purpose (`batch`, `batch_output`)",
        },
    ],
    answers={200: reply("a page of the files", FileList)},
    errors=[(InvalidParameter, "`limit`, `order` or `after` (not one of your files)"), Unauthorized, Unavailable],
)
def list_files() -> Response:
    asc = oldest_first()
    args, owner = request.args, current_owner()
    files, more = services().files.list(owner, list_limit(), args.get("after"), asc, args.get("purpose"))
    return jsonify(list_page([FileObject.of(f) for f in files], more))


@bp.get("/v1/files/<file_id>")
@documented(
    "getFile",
    "Get a file's record",
    "openai",
    answers={200: reply("the file", FileObject)},
    errors=[Unauthorized, FileNotFound, Unavailable],
)
def retrieve(file_id: str) -> Response:
    return jsonify(FileObject.of(services().files.get(file_id, current_owner())))


@bp.get("/v1/files/<file_id>/content")
@documented(
    "getFileContent",
    "Read a file's bytes",
    "openai",
    answers={200: reply("the file's bytes, as uploaded", {"type": "string"}, "application/octet-stream")},
    errors=[Unauthorized, FileNotFound, Unavailable],
)
def content(file_id: str) -> Response:
    data = services().files.content(file_id, current_owner())
    return Response(data, mimetype="application/octet-stream")


@bp.delete("/v1/files/<file_id>")
@documented(
    "deleteFile",
    "Delete a file",
    "openai",
    answers={200: reply("deleted", FileDeleted)},
    errors=[Unauthorized, Forbidden, FileNotFound, Unavailable],
)
def delete(file_id: str) -> Response:
    services().files.delete(file_id, current_owner())
    return jsonify({"id": file_id, "object": "file", "deleted": True})
