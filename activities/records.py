"""A line's result record (OpenAI's batch output/error line format) and the small outcome the
workflow counts, derived from a committed record. Pure: no I/O, no Temporal."""

from __future__ import annotations

import json
import secrets
from typing import Any

from backfill.batches import TokenCounts
from workflows.messages import LineOutcome

END_MESSAGES = {
    "batch_expired": "This request could not be executed before the completion window expired.",
    "batch_cancelled": "This request was not executed because the batch was cancelled.",
}
"""The message of the record a line gets when the batch ended before it ran."""


def new_record_id() -> str:
    return f"batch_req_{secrets.token_hex(12)}"


def error_record(custom_id: str, code: str, message: str) -> dict[str, Any]:
    return {
        "id": new_record_id(),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def outcome_from_record(line_no: int, data: bytes) -> LineOutcome:
    """The small outcome the workflow counts, derived from the committed record."""
    record = json.loads(data)
    response = record.get("response")
    error = record.get("error")
    if response is None:
        return LineOutcome(line=line_no, error_code=(error or {}).get("code"))
    status = int(response.get("status_code", 0))
    body = response.get("body")
    usage = usage_of(body.get("usage")) if isinstance(body, dict) else None
    return LineOutcome(
        line=line_no,
        ok=200 <= status < 300,
        status_code=status,
        error_code=None if 200 <= status < 300 else f"http_{status}",
        usage=usage,
    )


def usage_of(u: Any) -> TokenCounts | None:
    if not isinstance(u, dict):
        return None
    prompt = int(u.get("prompt_tokens") or u.get("input_tokens") or 0)
    completion = int(u.get("completion_tokens") or u.get("output_tokens") or 0)
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (u.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return TokenCounts(
        input_tokens=prompt,
        output_tokens=completion,
        total_tokens=int(u.get("total_tokens") or prompt + completion),
        cached_tokens=int(cached),
        reasoning_tokens=int(reasoning),
    )


def status_of(record: dict[str, Any]) -> int | None:
    response = record.get("response")
    return int(response["status_code"]) if response else None


def describe_error(err: Exception) -> str:
    return f"{type(err).__name__}: {err}"[:500]
