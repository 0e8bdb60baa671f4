"""Seat-aware admission on the real dev server: the route scheduler's allotment follows every
live count an api process reports, min("Batch lines at once", seats − keep_free − live), and
closes the route when no seat is left (the real RouteSchedulerWorkflow; the batch is a
stand-in that records and acknowledges its allotments)."""

from __future__ import annotations

import time
import uuid

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from backfill.ids import scheduler_workflow_id
from backfill.messages import (
    ClosedBatchesInput,
    ClosedBatchesOutput,
    Demand,
    LiveReport,
    RouteSettings,
    SchedulerInput,
    SchedulerStatus,
)
from backfill.reasons import WaitReason
from tests.polling import poll_until
from tests.workflows.seat_batch import SeatBatchWorkflow
from workflows.scheduler import RouteSchedulerWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")


@activity.defn(name="find_closed_batches")
async def none_closed(_: ClosedBatchesInput) -> ClosedBatchesOutput:
    return ClosedBatchesOutput()


async def test_the_allotment_follows_the_live_reports(temporal_client: Client) -> None:
    client = temporal_client
    queue = f"seats-{uuid.uuid4().hex[:8]}"
    route = f"route-{queue}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[RouteSchedulerWorkflow, SeatBatchWorkflow],
        activities=[none_closed],
    ):
        batch = await client.start_workflow(
            SeatBatchWorkflow.run, id=f"batch-{queue}", task_queue=queue
        )
        settings = RouteSettings(max_concurrent_lines=8, seat_aware={"seats": 10, "keep_free": 2})
        scheduler = await client.start_workflow(
            RouteSchedulerWorkflow.run,
            SchedulerInput(route_id=route, settings=settings, reconcile_seconds=3600),
            id=scheduler_workflow_id(route),
            task_queue=queue,
        )
        await scheduler.signal(
            RouteSchedulerWorkflow.demand,
            Demand(batch_id=batch.id, workspace="w", wanted=100),
        )

        async def last_allotment() -> int | None:
            sent = await batch.query(SeatBatchWorkflow.allotments)
            return sent[-1] if sent else None

        async def follows(live: int | None, expected: int) -> SchedulerStatus:
            if live is not None:
                report = LiveReport(process="api-1", in_flight=live)
                await scheduler.signal(RouteSchedulerWorkflow.report_live, report)
            await poll_until(
                last_allotment, lambda n: n == expected, timeout=30, what=f"{expected}"
            )
            return await scheduler.query(RouteSchedulerWorkflow.status, time.time())

        assert (await follows(None, 8)).limit == 8  # 10 − 2 − 0 ≥ the cap of 8
        status = await follows(3, 5)  # 10 − 2 − 3
        assert (status.state, status.limit, status.live_in_flight) == ("open", 5, 3)
        status = await follows(8, 0)  # no seat left: the route closes
        assert (status.state, status.reason) == ("paused", WaitReason.SEATS)
        assert (await follows(1, 7)).state == "open"
        assert (await follows(0, 8)).limit == 8
        sent = iter(await batch.query(SeatBatchWorkflow.allotments))
        assert all(n in sent for n in (8, 5, 0, 7, 8))  # in this order
        await scheduler.terminate()
        await batch.terminate()
