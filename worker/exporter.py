"""Route and stall metrics read from the workflows, without touching their determinism.

Every `metrics_poll_seconds`, each worker reads, through queries (which add nothing to any
history): every configured route's scheduler `status`, and every in-progress batch of its task
queue (a visibility query) with its `describe` and per-route reasons, as `GET /v1/batches/{id}`
computes them (`backfill.batches.progress`). From these it sets:

- `gateway_batch_route_lines{provider,state}`: `waiting` = the scheduler's queued lines,
  `running` = the lines the route's batches report running;
- `gateway_batch_paused_routes{reason}`: routes holding lines back, by the route's reason (a
  closed gate's; else `Gateway batch workers busy` when a batch's allotted lines wait for a
  worker slot; else the cap's reason while lines are queued);
- `gateway_batch_route_pauses_total{reason}`: a route's changes into a reason, between samples;
- `gateway_batch_stall_seconds{batch,workspace}`: each batch's stall clock (`worker/stall.py`);
- `gateway_batch_at_risk_batches{provider}`: batches whose expected finish at their recent pace
  (`backfill.batches.eta`, from these samples) is after `expires_at`, per route with lines left.

Every worker exports the same values (aggregate with `max by`); a worker that restarts starts
its stall clocks at 0, the others keep theirs, so `max` carries on. Clocks live in memory only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from backfill.batches.batch import Batch
from backfill.batches.eta import ProgressLog, Sample, estimate
from backfill.batches.progress import add_route_reasons
from backfill.platform import metrics
from backfill.platform.config import Settings
from backfill.platform.ids import scheduler_workflow_id
from backfill.platform.refs import BatchWorkflow, RouteSchedulerWorkflow
from backfill.routes.reasons import WaitReason
from backfill.routes.status import SchedulerStatus
from worker.stall import StallClock, advance

log = logging.getLogger(__name__)


def route_reason(status: SchedulerStatus | None, batches: list[Batch]) -> str | None:
    """The one reason the route holds lines back now, or None."""
    if status is None:
        return None
    if status.state == "paused":
        return status.reason
    for batch in batches:
        for p in batch.backfill.routes:
            if p.route == status.route_id and p.reason == WaitReason.WORKERS_BUSY:
                return WaitReason.WORKERS_BUSY
    return status.reason if status.queued_lines > 0 else None


@dataclass
class Exporter:
    client: Client
    settings: Settings
    clock: Callable[[], float] = time.time
    stalls: dict[tuple[str, str], StallClock] = field(default_factory=dict)
    """(batch id, workspace) -> its stall clock."""
    reasons: dict[str, str | None] = field(default_factory=dict)
    """Route id -> its reason at the last sample."""
    progress: ProgressLog = field(default_factory=ProgressLog)
    """Each in-progress batch's finished lines at recent samples (for its ETA)."""

    def __post_init__(self) -> None:
        for reason in WaitReason:  # every reason's series exists from the start (at 0)
            metrics.PAUSED_ROUTES.labels(reason)
            metrics.ROUTE_PAUSES.labels(reason)

    @property
    def routes(self) -> list[str]:
        return [r.id for m in self.settings.models for r in m.routes]

    async def run(self) -> None:
        """Sample every `metrics_poll_seconds` until cancelled; a failed sample is logged."""
        while True:
            try:
                await self.sample()
            except Exception:
                log.warning("metrics sample failed", exc_info=True)
            await asyncio.sleep(self.settings.metrics_poll_seconds)

    async def sample(self) -> None:
        now = self.clock()
        batches = await self._in_progress()
        statuses = await asyncio.gather(*(self._status(r) for r in self.routes))
        self._export_routes(dict(zip(self.routes, statuses, strict=True)), batches)
        self._export_stalls(batches, now)
        self._export_at_risk(batches, now)

    async def _in_progress(self) -> list[Batch]:
        query = (
            "WorkflowType='BatchWorkflow' AND ExecutionStatus='Running' "
            f"AND TaskQueue='{self.settings.task_queue}'"
        )
        ids = [wf.id async for wf in self.client.list_workflows(query)]
        found = await asyncio.gather(*(self._batch(i) for i in ids))
        return [b for b in found if b is not None]

    async def _batch(self, batch_id: str) -> Batch | None:
        handle = self.client.get_workflow_handle_for(BatchWorkflow.run, batch_id)
        try:
            batch = await handle.query(BatchWorkflow.describe)
            desc = await handle.describe()
            await add_route_reasons(self.client, batch, desc)
        except Exception as err:  # closed since the list, or not answering now: next sample
            log.debug("batch %s not readable: %s", batch_id, err)
            return None
        return batch

    async def _status(self, route_id: str) -> SchedulerStatus | None:
        handle = self.client.get_workflow_handle_for(
            RouteSchedulerWorkflow.run, scheduler_workflow_id(route_id)
        )
        try:
            return await handle.query(RouteSchedulerWorkflow.status, self.clock())
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                log.debug("scheduler %s status unavailable: %s", route_id, err)
            return None

    def _export_routes(
        self, statuses: dict[str, SchedulerStatus | None], batches: list[Batch]
    ) -> None:
        paused: dict[str, int] = dict.fromkeys(WaitReason, 0)
        for route_id, status in statuses.items():
            running = sum(
                p.running_lines for b in batches for p in b.backfill.routes if p.route == route_id
            )
            waiting = status.queued_lines if status is not None else 0
            metrics.ROUTE_LINES.labels(route_id, "waiting").set(waiting)
            metrics.ROUTE_LINES.labels(route_id, "running").set(running)
            reason = route_reason(status, batches)
            if reason is not None:
                paused[reason] = paused.get(reason, 0) + 1
                # A change seen between two samples (a worker's first sample is no change).
                if route_id in self.reasons and self.reasons[route_id] != reason:
                    metrics.ROUTE_PAUSES.labels(reason).inc()
            self.reasons[route_id] = reason
        for reason, count in paused.items():
            metrics.PAUSED_ROUTES.labels(reason).set(count)

    def _export_stalls(self, batches: list[Batch], now: float) -> None:
        seen: set[tuple[str, str]] = set()
        for batch in batches:
            key = (batch.id, batch.backfill.workspace or "")
            clock = advance(self.stalls.get(key), batch, now)
            if clock is None:
                continue
            seen.add(key)
            self.stalls[key] = clock
            metrics.STALL_SECONDS.labels(*key).set(clock.stalled)
        for key in set(self.stalls) - seen:
            del self.stalls[key]
            metrics.STALL_SECONDS.remove(*key)

    def _export_at_risk(self, batches: list[Batch], now: float) -> None:
        at_risk = dict.fromkeys(self.routes, 0)
        for batch in batches:
            counts = batch.request_counts
            samples = self.progress.add(batch.id, Sample(now, counts.completed + counts.failed))
            est = estimate(
                samples,
                total=counts.total,
                now=now,
                in_progress_at=batch.in_progress_at,
                expires_at=batch.expires_at,
            )
            if batch.status != "in_progress" or not est.at_risk:
                continue
            for p in batch.backfill.routes:
                if p.finished_lines < p.total_lines:
                    at_risk[p.route] = at_risk.get(p.route, 0) + 1
        for gone in set(self.progress.by_batch) - {b.id for b in batches}:
            self.progress.forget(gone)
        for route_id, count in at_risk.items():
            metrics.AT_RISK_BATCHES.labels(route_id).set(count)
