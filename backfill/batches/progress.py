"""Why a batch's lines wait: per route, the scheduler's reason and queue place (extension)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client, WorkflowExecutionDescription

from backfill.batches.batch import Batch, RouteProgress
from backfill.platform.ids import scheduler_workflow_id
from backfill.platform.refs import RouteSchedulerWorkflow
from backfill.routes.reasons import QUEUED_SUMMARY, WaitReason

log = logging.getLogger(__name__)


async def add_route_reasons(
    client: Client,
    batch: Batch,
    desc: WorkflowExecutionDescription,
    statuses: dict[str, asyncio.Task[Any]] | None = None,
) -> None:
    """Fill reason/queue_position of routes whose lines are held back, from the schedulers.
    `statuses` shares each scheduler's answer between the batches of one listing (one query
    per route, not per batch)."""
    ext = batch.backfill
    if ext.paused:
        return
    waiting = [p for p in ext.routes if p.state in ("queued", "running")]
    if not waiting:
        return
    pending = desc.raw_description.pending_activities
    scheduled_only = bool(pending) and all(
        a.state == PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED for a in pending
    )
    shared = {} if statuses is None else statuses
    await asyncio.gather(*(_one(client, batch, p, scheduled_only, shared) for p in waiting))
    held = [p for p in waiting if p.reason == WaitReason.MAINTENANCE]
    if (
        ext.summary == QUEUED_SUMMARY
        and held
        and all(p.reason == WaitReason.MAINTENANCE for p in waiting if p.reason)
    ):
        # Not waiting for capacity: held until the hold's end (the last of them to end).
        last = max(held, key=lambda p: p.reason_detail or "")
        ext.summary = last.shown_reason()


async def _status(client: Client, route: str) -> Any:
    handle = client.get_workflow_handle_for(
        RouteSchedulerWorkflow.run, scheduler_workflow_id(route)
    )
    return await handle.query(RouteSchedulerWorkflow.status, time.time())


async def _one(
    client: Client,
    batch: Batch,
    p: RouteProgress,
    scheduled_only: bool,
    statuses: dict[str, asyncio.Task[Any]],
) -> None:
    if p.allotment > 0 and p.running_lines > 0 and scheduled_only:
        # Lines allotted and scheduled, but no worker has a free activity slot to start them.
        p.reason = WaitReason.WORKERS_BUSY
        batch.backfill.summary = QUEUED_SUMMARY
        return
    if p.route not in statuses:
        statuses[p.route] = asyncio.ensure_future(_status(client, p.route))
    try:
        status = await asyncio.shield(statuses[p.route])
    except Exception as err:  # a scheduler that is not up yet simply has no reason to give
        log.debug("scheduler %s status unavailable: %s", p.route, err)
        return
    entry = next((b for b in status.batches if b.batch_id == batch.id), None)
    if entry is not None and entry.reason is not None:
        p.reason = entry.reason
        p.queue_position = entry.queue_position
        if entry.reason == status.reason:  # the route's closed gate: its detail goes with it
            p.reason_detail = status.reason_detail
