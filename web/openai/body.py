"""What several OpenAI endpoints' wire formats share: one page of a list, and whether a job's answer may hold tool
calls (chat completions and the Responses API read its calls out of its text)."""

from __future__ import annotations

from typing import Any

from tasks.job import Job


def makes_calls(job: Job) -> bool:
    """The job's answer may hold tool calls (its request gave tools the model may call)."""
    return job.spec.constraint is not None and job.spec.constraint.kind == "tools"


def list_page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """One page of an OpenAI list, with its cursors."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }
