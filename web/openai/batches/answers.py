"""What the Files and Batch APIs answer, as pydantic models: a file, a batch, and their lists."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from tasks.batches import BatchRecord, Status
from tasks.endpoints import Endpoint
from tasks.files import FileRecord
from web.responses import Answer


class FileObject(Answer):
    """An uploaded file (kept ONELANE_FILE_RETENTION)."""

    id: str = Field(description="`file-…`")
    object: Literal["file"]
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: Literal["batch", "batch_output"] = Field(
        description="`batch`: uploaded; `batch_output`: a batch's results"
    )
    status: Literal["processed"]
    status_details: None

    @classmethod
    def of(cls, file: FileRecord) -> dict[str, Any]:
        """The JSON body of `file`."""
        fields = file.model_dump(exclude={"owner"})
        return cls(**fields, object="file", status="processed", status_details=None).model_dump(mode="json")


class FileList(Answer):
    """A page of the caller's files, newest first unless `order=asc`."""

    object: Literal["list"]
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(Answer):
    id: str
    object: Literal["file"]
    deleted: Literal[True]


class BatchCounts(Answer):
    total: int = Field(description="every line of the input file")
    completed: int = Field(description="lines answered: the output file's")
    failed: int = Field(description="lines without an answer: the error file's")


class BatchError(Answer):
    code: str
    message: str
    param: str | None
    line: int | None


class BatchErrors(Answer):
    object: Literal["list"]
    data: list[BatchError]


class Batch(Answer):
    """A batch (OpenAI's Batch API): an uploaded file's requests run as batch-class jobs."""

    id: str = Field(description="`batch_…`")
    object: Literal["batch"]
    endpoint: Endpoint
    errors: BatchErrors | None = Field(description="why a `failed` batch ran nothing")
    input_file_id: str
    completion_window: Literal["24h"]
    status: Status
    output_file_id: str | None = Field(description="its answered lines, once it ended (none: null)")
    error_file_id: str | None = Field(description="its lines without an answer, once it ended (none: null)")
    created_at: int
    in_progress_at: int | None
    expires_at: int
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: BatchCounts
    metadata: dict[str, str] | None

    @classmethod
    def of(cls, batch: BatchRecord) -> dict[str, Any]:
        """The JSON body of `batch`."""
        fields = batch.model_dump(exclude={"owner", "total", "completed", "failed", "errors", "output_keep_s"})
        errors = {"object": "list", "data": batch.errors} if batch.errors else None
        counts = BatchCounts(total=batch.total, completed=batch.completed, failed=batch.failed)
        return cls(**fields, object="batch", errors=errors, request_counts=counts).model_dump(mode="json")


class BatchList(Answer):
    """The caller's batches, newest first."""

    object: Literal["list"]
    data: list[Batch]
    first_id: str | None
    last_id: str | None
    has_more: bool
