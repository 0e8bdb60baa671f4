"""The stall clock of a batch, pure: how long it has had lines to run and finished none,
not counting time it waited for a legitimate reason (`WaitReason.legitimate`).

`worker/exporter.py` samples every in-progress batch every `metrics_poll_seconds` and calls
`advance` with the batch as its `describe` query shows it (per-route reasons filled in as
`GET /v1/batches/{id}` fills them, `backfill/batches/progress.py`). The interval since the previous
sample counts as stalled unless the batch waits legitimately *now*; a finished line resets the
clock. Exported as `gateway_batch_stall_seconds{batch,workspace}`; the alert is in
deploy/prometheus/rules.yml (BackfillBatchStalled).
"""

from __future__ import annotations

from dataclasses import dataclass

from backfill.batches.batch import Batch
from backfill.routes.reasons import LEGITIMATE_WAITS, WaitReason


@dataclass(frozen=True)
class StallClock:
    finished: int
    """Lines the batch had finished at the last sample."""
    stalled: float
    """Seconds of unexplained standstill since its last finished line."""
    at: float
    """When the last sample was taken (unix seconds)."""


def lines_left(batch: Batch) -> int:
    return sum(max(0, r.total_lines - r.finished_lines) for r in batch.backfill.routes)


def lines_finished(batch: Batch) -> int:
    return sum(r.finished_lines for r in batch.backfill.routes)


def waits_legitimately(batch: Batch) -> bool:
    """True while nothing the batch could do is left undone for a good reason: it is paused, or
    every route with lines left has none running and holds them back for a legitimate reason
    (or has its allotted lines waiting for a worker slot). A route with lines running is not
    waiting: those lines should finish."""
    ext = batch.backfill
    if ext.paused:
        return True
    open_routes = [r for r in ext.routes if r.state in ("queued", "running")]
    return bool(open_routes) and all(
        r.reason == WaitReason.WORKERS_BUSY
        or (r.running_lines == 0 and r.reason in LEGITIMATE_WAITS)
        for r in open_routes
    )


def advance(clock: StallClock | None, batch: Batch, now: float) -> StallClock | None:
    """The batch's clock after a sample at `now`; None when it has no lines left to run (or is
    not in progress), which removes its series."""
    if batch.status != "in_progress" or lines_left(batch) == 0:
        return None
    finished = lines_finished(batch)
    if clock is None or finished != clock.finished:
        return StallClock(finished=finished, stalled=0.0, at=now)
    elapsed = max(0.0, now - clock.at)
    stalled = clock.stalled if waits_legitimately(batch) else clock.stalled + elapsed
    return StallClock(finished=finished, stalled=stalled, at=now)
