"""A stand-in for a batch whose lines each hold a slot for a fixed time (a workflow timer, so the
time-skipping server can run days of them in seconds). It speaks the batch's protocol with the
real route scheduler: it reports its demand (lines not finished, with its deadline and pace),
keeps as many lines running as its allotment allows, acknowledges shrinks once within them, and
stops starting lines when it expires, as `BatchWorkflow` does.

Its own module with few imports: the workflow sandbox re-imports a workflow's module."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from backfill.platform.ids import scheduler_workflow_id
    from backfill.platform.messages import Ack, Allotment, Demand


@dataclass
class PacedBatch:
    route_id: str
    workspace: str
    lines: int
    line_seconds: float
    window_seconds: float


@dataclass
class PacedOutcome:
    finished: int
    """Lines finished before the batch ended."""
    completed: bool
    """Every line finished before `expires_at`."""
    finished_at: float | None
    """When the last line finished (Unix seconds), if every line did."""
    expires_at: float
    allotments: list[tuple[float, int]]
    """Each allotment the scheduler sent: (hours since the batch started, lines)."""


@workflow.defn
class PacedBatchWorkflow:
    def __init__(self) -> None:
        self._allotment = 0
        self._epoch = 0
        self._unacked: int | None = None
        self._running = 0
        self._started = 0
        self._finished = 0
        self._dirty = False
        self._lines: set[asyncio.Task[None]] = set()
        self._allotments: list[tuple[float, int]] = []
        self._started_at = workflow.now().timestamp()

    @workflow.run
    async def run(self, batch: PacedBatch) -> PacedOutcome:
        expires_at = workflow.now().timestamp() + batch.window_seconds
        scheduler = workflow.get_external_workflow_handle(scheduler_workflow_id(batch.route_id))
        me = workflow.info().workflow_id
        reported: int | None = None
        finished_at: float | None = None

        async def report(wanted: int) -> None:
            demand = Demand(
                batch_id=me,
                workspace=batch.workspace,
                wanted=wanted,
                epoch=self._epoch,
                expires_at=expires_at,
                line_seconds=batch.line_seconds,
            )
            await scheduler.signal("demand", demand)

        while True:
            # Cleared before any await, as workflows/batch.py does: a line that ends (or a signal
            # that lands) while this loop reports demand or acks wakes the next wait at once.
            # Cleared after the reports, the last line's end was lost and the batch slept to its
            # expiry timer, "finishing" a few ms after expires_at (seen in CI runs).
            self._dirty = False
            now = workflow.now().timestamp()
            expired = now >= expires_at
            if self._finished == batch.lines and finished_at is None:
                finished_at = now
            if self._finished == batch.lines or (expired and self._running == 0):
                break
            while not expired and self._running < self._allotment and self._started < batch.lines:
                self._started += 1
                self._running += 1
                task = asyncio.create_task(self._line(batch.line_seconds))
                self._lines.add(task)
                task.add_done_callback(self._lines.discard)
            if self._unacked is not None and self._running <= self._allotment:
                ack = Ack(batch_id=me, epoch=self._unacked, running=self._running)
                self._unacked = None
                await scheduler.signal("ack", ack)
            # As `backfill.batches.lanes.demand_to_report`: rises at once, falls by quarters, and
            # the lines not finished (running + not started); none to start once expired.
            wanted = self._running if expired else batch.lines - self._finished
            if reported is None or wanted > reported or wanted <= reported * 3 // 4:
                if wanted != reported:
                    reported = wanted
                    await report(wanted)
            try:
                await workflow.wait_condition(
                    lambda: self._dirty, timeout=None if expired else expires_at - now
                )
            except TimeoutError:
                pass
        await report(0)
        return PacedOutcome(
            finished=self._finished,
            completed=finished_at is not None and finished_at <= expires_at,
            finished_at=finished_at,
            expires_at=expires_at,
            allotments=self._allotments,
        )

    async def _line(self, seconds: float) -> None:
        await workflow.sleep(seconds)
        self._running -= 1
        self._finished += 1
        self._dirty = True

    @workflow.signal
    def set_allotment(self, a: Allotment) -> None:
        if a.epoch <= self._epoch:
            return
        if a.lines < self._allotment or self._unacked is not None:
            self._unacked = a.epoch
        self._epoch = a.epoch
        self._allotment = a.lines
        self._allotments.append(((workflow.now().timestamp() - self._started_at) / 3600, a.lines))
        self._dirty = True
