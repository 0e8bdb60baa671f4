"""A route scheduler with one stand-in batch asking for 100 lines, on a task queue of their own:
the setup the seat-aware and reopen-ramp tests share (the real RouteSchedulerWorkflow; the batch
records and acknowledges its allotments)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from backfill.platform.ids import scheduler_workflow_id
from backfill.platform.messages import (
    ClosedBatchesInput,
    ClosedBatchesOutput,
    Demand,
    SchedulerInput,
)
from backfill.routes.settings import RouteSettings
from tests.workflows.ending import terminate_if_running
from tests.workflows.seat_batch import SeatBatchWorkflow
from workflows.scheduler import RouteSchedulerWorkflow


@activity.defn(name="find_closed_batches")
async def none_closed(_: ClosedBatchesInput) -> ClosedBatchesOutput:
    return ClosedBatchesOutput()


@dataclass
class SeatRoute:
    batch: WorkflowHandle[SeatBatchWorkflow, None]
    scheduler: WorkflowHandle[RouteSchedulerWorkflow, None]

    async def allotments(self) -> list[int]:
        """Every allotment the batch was sent, in order."""
        return await self.batch.query(SeatBatchWorkflow.allotments)


@asynccontextmanager
async def seat_route(
    client: Client,
    prefix: str,
    settings: RouteSettings,
    activities: Sequence[Callable[..., Any]] = (),
) -> AsyncIterator[SeatRoute]:
    queue = f"{prefix}-{uuid.uuid4().hex[:8]}"
    route = f"route-{queue}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[RouteSchedulerWorkflow, SeatBatchWorkflow],
        activities=[none_closed, *activities],
    ):
        batch = await client.start_workflow(
            SeatBatchWorkflow.run, id=f"batch-{queue}", task_queue=queue
        )
        scheduler = await client.start_workflow(
            RouteSchedulerWorkflow.run,
            SchedulerInput(route_id=route, settings=settings, reconcile_seconds=3600),
            id=scheduler_workflow_id(route),
            task_queue=queue,
        )
        await scheduler.signal(
            RouteSchedulerWorkflow.demand, Demand(batch_id=batch.id, workspace="w", wanted=100)
        )
        try:
            yield SeatRoute(batch, scheduler)
        finally:
            await terminate_if_running(client, scheduler.id)  # it may have continued as new
            await terminate_if_running(client, batch.id)
