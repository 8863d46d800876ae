"""OpenAI's Files API, for the Batch API's input: upload a JSONL file (`purpose=batch`), read it back, list, delete.

Files live in Redis (tasks/files.py), kept ONELANE_FILE_RETENTION, at most ONELANE_MAX_FILE_BYTES each (a larger
upload is 413 before it is read whole). Each owner sees only their own, listed a page at a time as OpenAI lists them
(`limit`, `after`, `order`, `purpose`).
"""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request
from werkzeug.exceptions import RequestEntityTooLarge

from tasks.errors import InvalidParameter, InvalidRequest
from web.auth import current_owner
from web.limits import list_limit
from web.openai.bodies import list_page
from web.openai.file_answers import FileObject
from web.services import services

bp = Blueprint("files", __name__)

PURPOSES = ("batch",)  # what onelane reads files for
FORM_SLACK = 64 * 1024  # the multipart framing and the `purpose` field around the file


@bp.post("/v1/files")
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
def list_files() -> Response:
    order = request.args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidParameter("order must be asc or desc", param="order")
    args, owner = request.args, current_owner()
    files, more = services().files.list(owner, list_limit(), args.get("after"), order == "asc", args.get("purpose"))
    return jsonify(list_page([FileObject.of(f) for f in files], more))


@bp.get("/v1/files/<file_id>")
def retrieve(file_id: str) -> Response:
    return jsonify(FileObject.of(services().files.get(file_id, current_owner())))


@bp.get("/v1/files/<file_id>/content")
def content(file_id: str) -> Response:
    data = services().files.content(file_id, current_owner())
    return Response(data, mimetype="application/octet-stream")


@bp.delete("/v1/files/<file_id>")
def delete(file_id: str) -> Response:
    services().files.delete(file_id, current_owner())
    return jsonify({"id": file_id, "object": "file", "deleted": True})
