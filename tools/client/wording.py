"""How `backfill batch` says a batch in a line: its headline, counts, refused input, estimate,
times. Pure strings (the commands print them)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from openai.types import Batch


def input_errors(batch: Batch) -> list[str]:
    if not batch.errors or not batch.errors.data:
        return []
    return [
        f"{e.code}" + (f" (line {e.line})" if e.line is not None else "") + f": {e.message}"
        for e in batch.errors.data
    ]


def headline(batch: Batch) -> str:
    c = batch.request_counts
    refused = input_errors(batch)
    if batch.status == "failed" and refused:
        n = len(refused)
        return f"{batch.id} failed: its input was refused ({n} error{'s' if n > 1 else ''})"
    counts = f"{c.completed} completed, {c.failed} failed of {c.total}" if c else "no counts"
    return f"{batch.id} {batch.status}: {counts}"


def counts(batch: Batch) -> str:
    c = batch.request_counts
    return f"{c.completed} completed, {c.failed} failed of {c.total}" if c else "no counts"


def estimate_line(ext: dict[str, Any]) -> str | None:
    """The estimate at submit (`backfill.estimate`) in a line; None for a batch without one."""
    est = ext.get("estimate")
    if not isinstance(est, dict):
        return None
    ahead = f"{est.get('lines_ahead', 0)} lines queued before it"
    finish = est.get("expected_finish_at")
    if est.get("window_achievable") is None:
        if not finish:
            return f"none (not enough throughput history on its route); {ahead}"
        return (
            f"expected to finish {utc_time(finish)} at the route's pace now, window not known "
            f"(no history for some of its hours); {ahead}"
        )
    expected = f"expected to finish {utc_time(finish)}" if finish else "not expected within weeks"
    verdict = "window looks achievable" if est["window_achievable"] else "LIKELY TO MISS its window"
    return f"{expected}, {verdict}; {ahead}"


def utc_time(ts: int | None) -> str:
    if not ts:
        return ""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
