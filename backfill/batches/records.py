"""A line's result record (OpenAI's batch output/error line format) and the small outcome the
workflow counts, derived from a committed record. Pure: no I/O, no Temporal.

Upstream data is read defensively: whatever a model server answers, and whatever a committed
record holds, nothing here raises. An unreadable `usage` counts as no usage.
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass
from typing import Any, Literal, overload

from backfill.batches.batch import TokenCounts
from backfill.platform import strict_json
from backfill.platform.messages import LineOutcome
from backfill.upstream.endpoints import USAGE_FIELDS, UsageFields

END_MESSAGES = {
    "batch_expired": "This request could not be executed before the completion window expired.",
    "batch_cancelled": "This request was not executed because the batch was cancelled.",
}
"""The message of the record a line gets when the batch ended before it ran."""

MAX_TOKEN_COUNT = 2**53
"""Larger counts are not real token counts (and would not survive a JSON round trip)."""


def placeholder_custom_id(line_no: int) -> str:
    """Stands in for the custom_id of a line that cannot be read."""
    return f"line-{line_no + 1}"


def custom_id_in(line: Any, line_no: int) -> str:
    """The custom_id of a decoded input line (a placeholder if it has none)."""
    custom_id = line.get("custom_id") if isinstance(line, dict) else None
    return custom_id if isinstance(custom_id, str) else placeholder_custom_id(line_no)


def custom_id_of(raw: bytes, line_no: int) -> str:
    """The custom_id of a validated input line (a placeholder if it cannot be read). Never
    raises: it names the line of every error record, the one written when all else failed."""
    try:
        return custom_id_in(strict_json.loads(raw), line_no)
    except Exception:
        return placeholder_custom_id(line_no)


def new_record_id() -> str:
    return f"batch_req_{secrets.token_hex(12)}"


_LINE_BREAKS = (
    (b"\xe2\x80\xa8", b"\\u2028"),
    (b"\xe2\x80\xa9", b"\\u2029"),
    (b"\xc2\x85", b"\\u0085"),
)
"""U+2028, U+2029 and U+0085 in UTF-8, and their JSON escapes."""


@overload
def one_line(data: bytes) -> bytes: ...
@overload
def one_line(data: bytearray) -> bytearray: ...
def one_line(data: bytes | bytearray) -> bytes | bytearray:
    """A UTF-8 JSON record with U+2028 (line separator), U+2029 (paragraph separator) and U+0085
    (next line) escaped, so that every reader sees it as one line: JSON allows the three raw in
    a string, and `str.splitlines()` (how many people read a JSONL file) ends a line at each.
    Outside strings JSON has only ASCII, and UTF-8 never hides these bytes inside another
    character, so replacing the bytes leaves the same JSON value. Copies only when one occurs."""
    for raw, escaped in _LINE_BREAKS:
        if raw in data:
            data = data.replace(raw, escaped)
    return data


def error_record(
    custom_id: str, code: str, message: str, record_id: str | None = None
) -> dict[str, Any]:
    return {
        "id": record_id or new_record_id(),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def error_record_bytes(
    custom_id: str, code: str, message: str, record_id: str | None = None
) -> bytes:
    record = error_record(custom_id, code, message, record_id)
    return json.dumps(record, separators=(",", ":")).encode()


def response_record_bytes(
    custom_id: str, status: int, request_id: str, body_json: str | bytes | bytearray
) -> bytes:
    """A response record around a body that is already valid JSON (text, or its UTF-8 bytes as
    they came off the wire), spliced in as is: an 8 MB answer is neither parsed into objects
    and dumped again nor copied more than once to be written (twice when it holds a character
    `one_line` escapes)."""
    head = json.dumps(
        {"id": new_record_id(), "custom_id": custom_id}, separators=(",", ":"), ensure_ascii=False
    )
    response_head = json.dumps(
        {"status_code": status, "request_id": request_id}, separators=(",", ":")
    )
    body = body_json.encode() if isinstance(body_json, str) else body_json
    prefix = f'{head[:-1]},"response":{response_head[:-1]},"body":'.encode()
    return b"".join((one_line(prefix), one_line(body), b'},"error":null}'))


@dataclass(frozen=True)
class CommittedRecord:
    """A committed record's parts, decoded once by the strict decoder (`read_committed`): every
    reader of a record (the workflow's outcome, a job's view) starts here."""

    kind: Literal["answer", "error", "other"]
    """`answer`: it has a `response` object; `error`: an `error` object; `other`: neither."""
    status_code: int | None = None
    """The answer's HTTP status (None: absent or not an integer)."""
    body: Any = None
    request_id: str | None = None
    error_code: str | None = None
    """The error object's code, when it is a string."""
    error_message: str | None = None


def read_committed(data: bytes) -> CommittedRecord | None:
    """A committed record read strictly (the upstream's body as it came: a number too large for
    a float reads as infinity); None when it is not one JSON object. Never raises."""
    try:
        record = strict_json.loads(data, finite=False)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    response, error = record.get("response"), record.get("error")
    if isinstance(response, dict):
        status = response.get("status_code")
        rid = response.get("request_id")
        return CommittedRecord(
            kind="answer",
            status_code=None if isinstance(status, bool) or not isinstance(status, int) else status,
            body=response.get("body"),
            request_id=rid if isinstance(rid, str) else None,
        )
    if isinstance(error, dict):
        code, message = error.get("code"), error.get("message")
        return CommittedRecord(
            kind="error",
            error_code=code if isinstance(code, str) else None,
            error_message=message if isinstance(message, str) else None,
        )
    return CommittedRecord(kind="other")


def outcome_from_record(line_no: int, data: bytes) -> LineOutcome:
    """The small outcome the workflow counts, derived from a committed record. Never raises: a
    record that cannot be read counts as a failed line with `invalid_record`."""
    record = read_committed(data)
    if record is None:
        return LineOutcome(line=line_no, error_code="invalid_record")
    if record.kind != "answer":
        return LineOutcome(line=line_no, error_code=record.error_code)
    status = record.status_code
    if status is None:
        return LineOutcome(line=line_no, error_code="invalid_record")
    body = record.body
    ok = 200 <= status < 300
    return LineOutcome(
        line=line_no,
        ok=ok,
        status_code=status,
        error_code=None if ok else f"http_{status}",
        usage=usage_of(body.get("usage")) if isinstance(body, dict) else None,
    )


def _count(value: Any) -> int | None:
    """A token count, or None when `value` is not one (a string, a bool, negative, 1e400...)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            return None
        value = int(value)
    if isinstance(value, int) and 0 <= value <= MAX_TOKEN_COUNT:
        return value
    return None


class _Unreadable(Exception):
    """A usage field that is present but is not a token count."""


def _field(u: dict[str, Any], *names: str) -> int | None:
    """The count under the first of `names` present in `u` (None if none is)."""
    for name in names:
        if u.get(name) is not None:
            n = _count(u[name])
            if n is None:
                raise _Unreadable(name)
            return n
    return None


def _detail(u: dict[str, Any], where: tuple[str, str]) -> int:
    group, name = where
    details = u.get(group)
    if details is None:
        return 0
    if not isinstance(details, dict):
        raise _Unreadable(group)
    return _field(details, name) or 0


def usage_of(u: Any, fields: UsageFields | None = None) -> TokenCounts | None:
    """An answer's usage object as token counts; None when unknown.

    `fields` is the endpoint's layout (`backfill.upstream.endpoints`); without it (a record whose
    endpoint is not known) the first registered layout that has an input or output count is
    read. Unknown: not an object, no token count in it, or any count that is not a
    non-negative integer. One odd field makes the whole usage unknown rather than half right."""
    if not isinstance(u, dict):
        return None
    if fields is None:
        fields = next(
            (f for f in USAGE_FIELDS if u.get(f.input) is not None or u.get(f.output) is not None),
            USAGE_FIELDS[0],
        )
    try:
        prompt = _field(u, fields.input)
        completion = _field(u, fields.output)
        total = _field(u, "total_tokens")
        cached = _detail(u, fields.cached)
        reasoning = _detail(u, fields.reasoning)
    except _Unreadable:
        return None
    if prompt is None and completion is None:
        return None
    prompt, completion = prompt or 0, completion or 0
    return TokenCounts(
        input_tokens=prompt,
        output_tokens=completion,
        total_tokens=total if total is not None else prompt + completion,
        cached_tokens=cached,
        reasoning_tokens=reasoning,
    )


def status_of(record: dict[str, Any]) -> int | None:
    response = record.get("response")
    if not isinstance(response, dict):
        return None
    status = response.get("status_code")
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def describe_error(err: Exception) -> str:
    return f"{type(err).__name__}: {err}"[:500]
