"""Single durable jobs (`/gateway/v1/batches`): the job view of a one-line batch. Pure.

A job IS a batch of one line, created by the api with `JOB_METADATA` in its metadata, so it gets
the route's gates, fairness, durability and exactly-once from the batch machinery. This module
holds the other side: what a job looks like, built from the batch (status, the `paused`
extension, running lines, request counts) and the line's committed result record (request id,
HTTP status). No I/O, no Temporal: the api reads both and calls `job_of`.

The state mapping (docs/api.md, "Single jobs"), first match wins:

| Batch                                                   | Job          |
|---------------------------------------------------------|--------------|
| `completed` or `expired`, its line completed            | `completed`  |
| `completed` or `expired` otherwise; `failed`            | `failed`     |
| `cancelled`                                             | `cancelled`  |
| `cancelling`                                            | `cancelling` |
| `finalizing`; or its line has finished                  | `running`    |
| paused (extension), its line still running              | `pausing`    |
| paused, nothing running                                 | `paused`     |
| its line running                                        | `running`    |
| `validating` or `in_progress`, nothing running          | `queued`     |
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from backfill.batches.batch import Batch, BatchStatus
from backfill.batches.records import read_committed

JOB_METADATA_KEY = "backfill_job"
"""The metadata key that marks a batch as a job (value `JOB_METADATA_VALUE`)."""
JOB_METADATA_VALUE = "1"
JOB_METADATA = {JOB_METADATA_KEY: JOB_METADATA_VALUE}
JOB_MEMO = "backfill_job"
"""Memo key set (True) on a job's workflow, so a listing finds jobs without loading batches."""
JOB_CUSTOM_ID = "job"
"""The custom_id of a job's one line (in the batch's output and error files)."""

JobState = Literal[
    "queued", "running", "pausing", "paused", "cancelling", "cancelled", "completed", "failed"
]
TERMINAL_JOB_STATES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})

NOT_SENT_CODES = frozenset({"batch_expired", "batch_cancelled", "route_removed"})
"""Error codes of records a line gets without being sent (it never reached the backend)."""


def is_job(metadata: dict[str, str] | None) -> bool:
    """The batch with this metadata is a job."""
    return metadata is not None and metadata.get(JOB_METADATA_KEY) == JOB_METADATA_VALUE


def job_memo(metadata: dict[str, str] | None) -> dict[str, Any]:
    """What a batch's workflow memo holds besides the rest, by its metadata."""
    return {JOB_MEMO: True} if is_job(metadata) else {}


def job_line(path: str, body: dict[str, Any]) -> bytes:
    """The job's batch input: one JSONL line (with its newline)."""
    line = {"custom_id": JOB_CUSTOM_ID, "method": "POST", "url": path, "body": body}
    return json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


class JobError(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    code: str
    """`http_<status>` for a backend's error answer (its message, if it had one), else the
    batch's own code (`unknown_model`, `batch_expired`, `response_too_large`, ...)."""
    message: str


class LineRecord(BaseModel):
    """What a job shows of its line's committed result record (`backfill.batches.records`)."""

    request_id: str | None = None
    """The `X-Request-ID` the gateway sent with the attempt that was kept."""
    status_code: int | None = None
    """The backend's HTTP status (None: no answer was kept)."""
    body: Any = None
    """The backend's answer body (any JSON)."""
    error: JobError | None = None
    sent: bool = False
    """The request reached the backend (or was sent and lost, too large, ...)."""


def read_record(data: bytes | None) -> LineRecord | None:
    """The parts of a committed record (one JSONL line, read by `records.read_committed`) a job
    shows; None when there is no record or it cannot be read. Never raises."""
    record = read_committed(data) if data else None
    if record is None:
        return None
    if record.kind == "answer":
        status = record.status_code
        out = LineRecord(
            request_id=record.request_id, status_code=status, body=record.body, sent=True
        )
        if status is None or not 200 <= status < 300:
            out.error = JobError(
                code=f"http_{status}", message=_answer_message(record.body, status)
            )
        return out
    if record.kind == "error":
        code = record.error_code or "error"
        return LineRecord(
            error=JobError(code=code, message=record.error_message or ""),
            sent=code not in NOT_SENT_CODES,
        )
    return None


RECORD_HEAD_BYTES = 64 * 1024
"""Most bytes of a job's record read for its view (state, status, request id, error): never
the whole answer, which may be as large as `limits.max_response_bytes`."""
_BODY_KEY = b',"body":'
"""Where an answer record's body starts (`records.response_record_bytes` writes the status and
request id before it). A quote after a comma never occurs inside a JSON string (a quote there
is escaped), so the first match is the key."""


def read_record_head(head: bytes, *, cut: bool) -> LineRecord | None:
    """`read_record` of a record of which only `head` was read: `cut` when the record goes on
    past it. The first line only (an output file holds one). A cut answer record shows its
    status and request id, not its body (an error answer's message is the plain one)."""
    end = head.find(b"\n")
    if end >= 0 or not cut:
        return read_record(head[:end] if end >= 0 else head)
    at = head.find(_BODY_KEY)
    if at < 0:
        return None
    return read_record(head[:at] + b"}}")


def _answer_message(body: Any, status: int | None) -> str:
    """The message of a backend's error answer (OpenAI's envelope), else a plain one."""
    err = body.get("error") if isinstance(body, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    if isinstance(message, str) and message:
        return message
    return f"The backend answered HTTP {status}."


def settled_state(status: BatchStatus, completed_lines: int) -> JobState | None:
    """The job's state when its batch's status and completed count decide it alone (an ended
    or cancelling batch), else None (the running lines and the pause decide)."""
    if status in ("completed", "expired"):
        return "completed" if completed_lines > 0 else "failed"
    if status == "failed":
        return "failed"
    if status in ("cancelled", "cancelling"):
        return status
    return None


BATCH_STATUSES: dict[JobState, tuple[BatchStatus, ...]] = {
    "completed": ("completed", "expired"),
    "failed": ("completed", "expired", "failed"),
    "cancelled": ("cancelled",),
    "cancelling": ("cancelling",),
    "running": ("validating", "in_progress", "finalizing"),
    "pausing": ("validating", "in_progress"),
    "paused": ("validating", "in_progress"),
    "queued": ("validating", "in_progress"),
}
"""The batch statuses a job in each state can have (a listing's first, coarse filter)."""


def job_state(batch: Batch) -> JobState:
    """The job's state from its batch (the table in the module doc)."""
    counts = batch.request_counts
    status = batch.status
    settled = settled_state(status, counts.completed)
    if settled is not None:
        return settled
    running = sum(r.running_lines for r in batch.backfill.routes)
    finished = counts.completed + counts.failed > 0
    if status == "finalizing" or finished:
        return "running"
    if batch.backfill.paused:
        return "pausing" if running else "paused"
    return "running" if running else "queued"


class Job(BaseModel):
    """A single job (`/gateway/v1/batches`): one request, run as a one-line batch."""

    model_config = ConfigDict(
        json_schema_serialization_defaults_required=True, use_attribute_docstrings=True
    )

    id: str
    """The job's id, which is also its batch's id (`/v1/batches/{id}` shows the batch)."""
    object: Literal["gateway.batch"] = "gateway.batch"
    path: str
    """The endpoint the request is sent to (`/v1/chat/completions`, ...)."""
    state: JobState
    model: str | None = None
    created_at: int
    """Unix seconds."""
    expires_at: int | None = None
    """When its completion window ends: a job not run by then ends `failed` (`batch_expired`)."""
    finished_at: int | None = None
    """When it reached its final state (completed, failed or cancelled)."""
    attempts: int = 0
    """Sends of the request the gateway kept: 0 before it is sent, 1 once it runs or has
    an answer. A send answered 429/502/503/504 (or whose connection failed) and sent again is
    not counted."""
    request_id: str | None = None
    """The `X-Request-ID` of the latest attempt kept (null until it has an answer)."""
    status_code: int | None = None
    """The backend's HTTP status for that attempt (null until it has an answer)."""
    error: JobError | None = None
    """Why it failed (null unless `failed`)."""
    paused_by: str | None = None
    """The key name that paused it (while `pausing` or `paused`)."""
    metadata: dict[str, str] | None = None
    """The metadata given at creation (without the job marker)."""


def job_of(batch: Batch, record: LineRecord | None) -> Job:
    """The job view of `batch` (a job's one-line batch) and its line's record, if any."""
    state = job_state(batch)
    running = sum(r.running_lines for r in batch.backfill.routes)
    metadata = {k: v for k, v in (batch.metadata or {}).items() if k != JOB_METADATA_KEY}
    error: JobError | None = None
    if state == "failed":
        error = record.error if record is not None else None
        if error is None and batch.errors is not None and batch.errors.data:
            first = batch.errors.data[0]
            error = JobError(code=first.code, message=first.message)
        if error is None and batch.status == "expired":
            error = JobError(
                code="batch_expired",
                message="The job was not run before its completion window ended.",
            )
        if error is None:
            error = JobError(code="failed", message="The job failed.")
    finished_at = (
        batch.completed_at or batch.failed_at or batch.expired_at or batch.cancelled_at
        if state in TERMINAL_JOB_STATES
        else None
    )
    return Job(
        id=batch.id,
        path=batch.endpoint,
        state=state,
        model=batch.model,
        created_at=batch.created_at,
        expires_at=batch.expires_at,
        finished_at=finished_at,
        attempts=1 if (record is not None and record.sent) or running else 0,
        request_id=record.request_id if record is not None else None,
        status_code=record.status_code if record is not None else None,
        error=error,
        paused_by=batch.backfill.paused_by if state in ("pausing", "paused") else None,
        metadata=metadata or None,
    )
