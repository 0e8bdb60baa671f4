"""A batch's lifecycle, pure: status transitions with their timestamps, the progress shown in
the extension fields, and when the workflow must next wake up.

No temporalio import: `BatchWorkflow` passes `workflow.now()` in and acts on the answers.
"""

from __future__ import annotations

from typing import Any

from backfill.batches.batch import (
    COMPLETION_WINDOWS,
    BackfillExtension,
    Batch,
    BatchStatus,
    RouteProgress,
)
from backfill.batches.lanes import Lane
from backfill.platform.messages import BatchInput, EndReason, LineOutcome
from backfill.routes.reasons import QUEUED_SUMMARY


def initial_batch(input: BatchInput) -> Batch:
    """The Batch object as created, before validation (also what the api answers)."""
    hours = COMPLETION_WINDOWS[input.completion_window]
    return Batch(
        id=input.batch_id,
        endpoint=input.endpoint,
        input_file_id=input.input_file_id,
        completion_window=input.completion_window,
        status="validating",
        created_at=input.created_at,
        expires_at=input.created_at + hours * 3600,
        metadata=input.metadata,
        backfill=BackfillExtension(workspace=input.workspace, estimate=input.estimate),
    )


# ---- status transitions ----
NEXT_STATUSES: dict[BatchStatus, frozenset[BatchStatus]] = {
    "validating": frozenset({"in_progress", "failed", "cancelling"}),
    "in_progress": frozenset({"finalizing", "cancelling", "expired", "failed"}),
    "cancelling": frozenset({"cancelled", "failed", "expired"}),
    "finalizing": frozenset({"completed", "failed"}),
}
"""Which statuses may follow which. Two follow `cancelling` besides `cancelled`: `failed`, when
the input of a batch cancelled while validating is rejected (there is nothing to cancel), and
`expired`, when a cancel arrives while an expired batch's files are already being assembled.
`failed` follows `in_progress` (an expired batch) and `finalizing` when the files could not be
assembled (the store stayed unavailable until the deadline: `backfill.batches.storage_waits`)."""

STAMPS: dict[BatchStatus, str] = {
    "in_progress": "in_progress_at",
    "failed": "failed_at",
    "cancelling": "cancelling_at",
    "finalizing": "finalizing_at",
    "completed": "completed_at",
    "cancelled": "cancelled_at",
    "expired": "expired_at",
}
"""The timestamp each status sets when entered."""


def transition(batch: Batch, to: BatchStatus, now: int) -> None:
    """Move `batch` to status `to` at `now` (unix seconds) and stamp it; an illegal move raises.

    `expired_at` keeps the moment the window ended (set by `check_expiry`), not the later moment
    the files were assembled.
    """
    if to not in NEXT_STATUSES.get(batch.status, frozenset()):
        allowed = sorted(NEXT_STATUSES.get(batch.status, frozenset()))
        raise ValueError(
            f"a batch cannot go from {batch.status!r} to {to!r}"
            + (f" (only to {', '.join(allowed)})" if allowed else f" ({batch.status!r} is final)")
        )
    batch.status = to
    stamp = STAMPS[to]
    if to != "expired" or getattr(batch, stamp) is None:
        setattr(batch, stamp, now)


def may_cancel(batch: Batch) -> bool:
    """A cancel (signal, update or cancellation request) takes effect: still validating or
    running. Later it is too late: the batch ends as it was going to."""
    return batch.status in ("validating", "in_progress")


def check_expiry(batch: Batch, lanes: list[Lane], now: int) -> None:
    """At `expires_at` a batch that is not being cancelled stops starting lines; the status
    turns `expired` once its files are assembled."""
    if batch.expired_at is not None or batch.status == "cancelling":
        return
    if now >= (batch.expires_at or 0):
        batch.expired_at = now
        for lane in lanes:
            lane.stop()


def end_status(reason: EndReason) -> BatchStatus:
    """The status a batch ends in once its files are assembled for `reason`."""
    return "completed" if reason == "completed" else reason


# ---- what the batch shows (extension fields) ----
def show_progress(batch: Batch, lanes: list[Lane], *, ending: bool) -> None:
    """Fill `backfill.routes` and `backfill.summary` from the lanes."""
    ext = batch.backfill
    ext.routes = [
        RouteProgress(
            model=lane.model,
            route=lane.route_id,
            state=lane.state(paused=ext.paused),
            running_lines=lane.running,
            allotment=lane.allotment,
            total_lines=lane.total,
            finished_lines=lane.finished,
            preempted_lines=lane.preempted_lines,
            wasted_tokens=lane.wasted_tokens,
            reprefill_tokens=lane.reprefill_tokens,
        )
        for lane in lanes
    ]
    held_back = any(lane.pending_count() > 0 for lane in lanes)
    running = sum(lane.running for lane in lanes)
    if ext.paused:
        ext.summary = "Paused"
    elif held_back and running == 0 and not ending:
        ext.summary = QUEUED_SUMMARY
    else:
        ext.summary = None


SUMMARY_MEMO = "summary"
"""Memo key of the batch's one-line summary (the api's `static_summary`): the memo is carried
over continue-as-new, the start's user metadata is not."""


STATUS_MEMO = "status"
"""Memo key of the batch's compact status (`status_memo`), written at each status change: what
the api answers from, marked stale, when no worker can answer the batch's query."""
STATUS_MEMO_FIELDS = frozenset(
    {
        "status",
        "request_counts",
        "in_progress_at",
        "expires_at",
        "finalizing_at",
        "completed_at",
        "failed_at",
        "expired_at",
        "cancelling_at",
        "cancelled_at",
        "output_file_id",
        "error_file_id",
    }
)


def status_memo(batch: Batch) -> dict[str, Any]:
    """The batch's status, counts and times as JSON: small (no metadata, errors or routes)."""
    return batch.model_dump(mode="json", include=set(STATUS_MEMO_FIELDS))


def current_details(batch: Batch, summary: str | None) -> str:
    """The batch's "current details" in the Temporal UI (Temporal markdown): its summary, status,
    progress, and per route the state and lines. Set on every run, so it survives
    continue-as-new; the per-route reasons and queue places live in the schedulers (`GET
    /v1/batches/{id}`, or each `RouteSchedulerWorkflow`'s own details)."""
    ext = batch.backfill
    counts = batch.request_counts
    finished = sum(p.finished_lines for p in ext.routes) or counts.completed + counts.failed
    total = sum(p.total_lines for p in ext.routes) or counts.total
    head = f"**{batch.status}**"
    if ext.paused:
        head += f" · paused by {ext.paused_by}" if ext.paused_by else " · paused"
    if ext.summary and not ext.paused:
        head += f" · {ext.summary}"
    lines = [summary] if summary else []
    lines.append(f"{head} · {finished}/{total} lines finished")
    lines += [
        f"- {p.route} ({p.model}): {p.state}, {p.running_lines} running "
        f"(allotment {p.allotment}), {p.finished_lines}/{p.total_lines}"
        for p in ext.routes
    ]
    return "\n".join(lines)


def show_done(batch: Batch) -> None:
    """The extension fields of an ended batch: no summary, every route done."""
    batch.backfill.summary = None
    for p in batch.backfill.routes:
        p.reason, p.running_lines, p.allotment = None, 0, 0
        p.state = "done"


def tally_line(batch: Batch, outcome: LineOutcome) -> None:
    """Count a line that ended for good into the batch's `request_counts` and `usage`. These
    running tallies are for progress only (the status memo, the UI, a retrieve while the batch
    runs): when the batch ends they are replaced by finalizing's, counted from the committed
    records, which also hold the lines the workflow never saw end (committed by a worker that
    died, or cancelled with the workflow)."""
    counts = batch.request_counts
    if outcome.ok:
        counts.completed += 1
    else:
        counts.failed += 1
    if outcome.usage is not None:
        batch.usage.add(outcome.usage)


# ---- when to wake up ----
KEEPALIVE_SECONDS = 3600.0
"""Re-send demand that got no allotment this long after reporting it (a scheduler that was
terminated or reset comes back through signal-with-start)."""


def keepalive_due(lane: Lane, *, quiet: bool) -> float | None:
    """When to re-send the lane's demand, if it waits for an allotment. `quiet`: paused, ending
    or draining (no demand worth keeping alive)."""
    if quiet:
        return None
    if lane.pending_count() == 0 or lane.allotment > 0 or lane.reported_at is None:
        return None
    return lane.reported_at + KEEPALIVE_SECONDS


def next_wakeup(
    lanes: list[Lane],
    *,
    expires_at: int,
    ending: bool,
    quiet: bool,
    backoffs_when_quiet: bool = True,
) -> float | None:
    """The earliest deadline: expiry (unless ending), a route's backoff, or a keep-alive.

    `backoffs_when_quiet=False` (the `alarms-on-time` rule): a back-off's end matters only while
    lines may start; a paused, ending or draining batch starts none when it passes, so waking
    for it is waste (and, once passed, a deadline the old rule kept ringing for)."""
    candidates: list[float] = []
    if not ending:
        candidates.append(float(expires_at))
    for lane in lanes:
        if lane.backoff_until is not None and (backoffs_when_quiet or not quiet):
            candidates.append(lane.backoff_until)
        keepalive = keepalive_due(lane, quiet=quiet)
        if keepalive is not None:
            candidates.append(keepalive)
    return min(candidates) if candidates else None
