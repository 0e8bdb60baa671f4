"""Activities that talk to Temporal itself: register demand with a route's scheduler
(signal-with-start, so the scheduler starts lazily; `backfill.routes.scheduler_client`) and find
batches that closed while holding slots (reconciliation)."""

from __future__ import annotations

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from backfill.platform.config import Settings
from backfill.platform.messages import (
    ClosedBatchesInput,
    ClosedBatchesOutput,
    DemandInput,
)
from backfill.routes.scheduler_client import signal_demand


class ControlActivities:
    def __init__(self, settings: Settings, client: Client) -> None:
        self.settings = settings
        self.client = client

    @activity.defn
    async def report_demand(self, input: DemandInput) -> None:
        await signal_demand(self.client, self.settings, input)

    @activity.defn
    async def find_closed_batches(self, input: ClosedBatchesInput) -> ClosedBatchesOutput:
        closed, missing = [], []
        for batch_id in input.batch_ids:
            try:
                desc = await self.client.get_workflow_handle(batch_id).describe()
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    closed.append(batch_id)
                    missing.append(batch_id)
                    continue
                raise
            if desc.status != WorkflowExecutionStatus.RUNNING:
                closed.append(batch_id)
        return ClosedBatchesOutput(closed=closed, missing=missing)
