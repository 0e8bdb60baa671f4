"""A batch line's answer: the record it commits, its outcome, and whether to send it again.

Pure (no I/O): the line activity (`activities.lines.run_line`) builds one `Answer` for every way a
line ends: a complete HTTP answer (`http_answer`), or a failure of its own (`failed`, `unexpected`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

from backfill.batches.records import (
    describe_error,
    error_record_bytes,
    response_record_bytes,
    usage_of,
)
from backfill.platform import strict_json
from backfill.platform.messages import LineOutcome
from backfill.upstream.endpoints import EndpointSpec

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
"""Answers that say "not now" rather than "no": the line goes back to the queue and the route
backs off (a bounded number of times, then the answer is recorded)."""


@dataclass(frozen=True)
class Answer:
    """A line's record as bytes, its outcome, and whether it is worth sending again."""

    data: bytes
    outcome: LineOutcome
    retry: bool = False
    retry_after: float | None = None
    """The upstream's Retry-After, in seconds."""


def failed(custom_id: str, line_no: int, code: str, message: str, *, retry: bool = False) -> Answer:
    data = error_record_bytes(custom_id, code, message)
    return Answer(data, LineOutcome(line=line_no, error_code=code), retry)


def unexpected(custom_id: str, line_no: int, err: Exception) -> Answer:
    """The record of a line that hit a bug (or a line too odd for today's rules): failed, so
    the batch goes on instead of sending it again forever."""
    return failed(custom_id, line_no, "internal_error", describe_error(err))


def http_answer(
    custom_id: str,
    line_no: int,
    status: int,
    request_id: str,
    content_type: str,
    body: bytes | bytearray,
    spec: EndpointSpec | None = None,
) -> Answer:
    """The record of a complete HTTP answer. A 2xx must be a JSON object to count as completed;
    the body is written as it came (valid JSON) or, when it is not JSON, wrapped in an error.

    Memory: the parsed answer is only looked at (is it an object, its usage) and dropped before
    the record is built from the original bytes, so a line holds at most the body, its text and
    its parse at once, then the body and the record."""
    ok = 200 <= status < 300
    parsed: Any = None
    is_json = False
    try:
        parsed = strict_json.loads(body, finite=False)  # kept as it came, only looked at
        is_json = True
    except ValueError:
        pass
    if ok and not isinstance(parsed, dict):
        what = "not JSON" if not is_json else f"JSON but not an object ({type(parsed).__name__})"
        snippet = bytes(body[:200]).decode("utf-8", errors="replace")
        msg = f"The upstream answered {status} with a body that is {what} ({content_type}): "
        return failed(custom_id, line_no, "invalid_response", msg + repr(snippet))
    fields = spec.usage if spec is not None else None
    usage = usage_of(parsed.get("usage"), fields) if isinstance(parsed, dict) else None
    if usage is None and fields is not None and isinstance(parsed, dict):
        # Counts in another endpoint's layout are still tokens spent, and are what a reader of
        # the record finds (`records.outcome_from_record` reads whichever layout has them).
        usage = usage_of(parsed.get("usage"))
    del parsed
    if is_json:  # valid UTF-8 JSON: its bytes are exactly the text's, spliced in as they came
        data = response_record_bytes(custom_id, status, request_id, body)
    else:  # an error answer that is not JSON: keep its text, readable
        snippet = bytes(body[:2000]).decode("utf-8", errors="replace")
        text = json.dumps({"error": {"message": snippet}}, separators=(",", ":"))
        data = response_record_bytes(custom_id, status, request_id, text)
    outcome = LineOutcome(
        line=line_no,
        ok=ok,
        status_code=status,
        error_code=None if ok else f"http_{status}",
        usage=usage,
    )
    return Answer(data, outcome, status in RETRYABLE_STATUS)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP date (RFC 9110); None when
    absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
