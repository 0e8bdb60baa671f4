"""The ETA fields of a batch served by this api process (`backfill.batches.eta`): each read of a
running batch is a progress sample, kept in this process's memory (each replica keeps its own)."""

from __future__ import annotations

import time

from backfill.batches.batch import TERMINAL_STATUSES, Batch
from backfill.batches.eta import ProgressLog, Sample, estimate

PROGRESS = ProgressLog()


def fill_eta(batch: Batch, now: float | None = None) -> None:
    """Set `lines_per_second`, `expected_finish_at` and `at_risk` on a batch being read."""
    if batch.status in TERMINAL_STATUSES or batch.backfill.stale:
        PROGRESS.forget(batch.id)
        return
    if batch.status != "in_progress":
        return
    now = time.time() if now is None else now
    counts = batch.request_counts
    samples = PROGRESS.add(batch.id, Sample(now, counts.completed + counts.failed))
    est = estimate(
        samples,
        total=counts.total,
        now=now,
        in_progress_at=batch.in_progress_at,
        expires_at=batch.expires_at,
    )
    ext = batch.backfill
    ext.lines_per_second = est.lines_per_second
    if not ext.paused:  # a paused batch finishes when someone resumes it: no guess
        ext.expected_finish_at = est.expected_finish_at
        ext.at_risk = est.at_risk
