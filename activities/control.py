"""Activities that talk to Temporal itself: register demand with a route's scheduler
(signal-with-start, so the scheduler starts lazily) and find batches that closed while holding
slots (reconciliation). `start_scheduler` is also the api's way to reach a route's scheduler."""

from __future__ import annotations

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from backfill.config import Settings
from backfill.ids import scheduler_workflow_id
from workflows import refs
from workflows.messages import (
    ClosedBatchesInput,
    ClosedBatchesOutput,
    Demand,
    DemandInput,
    RouteSettings,
    SchedulerInput,
)


class ControlActivities:
    def __init__(self, settings: Settings, client: Client) -> None:
        self.settings = settings
        self.client = client

    @activity.defn
    async def report_demand(self, input: DemandInput) -> None:
        await signal_demand(self.client, self.settings, input)

    @activity.defn
    async def find_closed_batches(self, input: ClosedBatchesInput) -> ClosedBatchesOutput:
        closed = []
        for batch_id in input.batch_ids:
            try:
                desc = await self.client.get_workflow_handle(batch_id).describe()
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    closed.append(batch_id)
                    continue
                raise
            if desc.status != WorkflowExecutionStatus.RUNNING:
                closed.append(batch_id)
        return ClosedBatchesOutput(closed=closed)


async def start_scheduler(
    client: Client, settings: Settings, route_id: str, demand: Demand | None = None
) -> WorkflowHandle[refs.RouteSchedulerWorkflow, None]:
    """The route's scheduler, started unless it runs (the configured settings are its initial
    ones); with `demand`, signalled in the same call (signal-with-start)."""
    route = settings.route(route_id)
    initial = RouteSettings(max_concurrent_lines=route.max_concurrent_lines if route else 2)
    return await client.start_workflow(
        refs.RouteSchedulerWorkflow.run,
        SchedulerInput(
            route_id=route_id,
            settings=initial,
            reconcile_seconds=settings.scheduler_reconcile_seconds,
        ),
        id=scheduler_workflow_id(route_id),
        task_queue=settings.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        start_signal=None
        if demand is None
        else refs.signal_name(refs.RouteSchedulerWorkflow.demand),
        start_signal_args=[] if demand is None else [demand],
    )


async def signal_demand(client: Client, settings: Settings, input: DemandInput) -> None:
    """Signal-with-start the route's scheduler with a batch's demand."""
    demand = Demand(
        batch_id=input.batch_id,
        workspace=input.workspace,
        wanted=input.wanted,
        epoch=input.epoch,
        weight=settings.workspace_limits(input.workspace).share_weight,
    )
    await start_scheduler(client, settings, input.route_id, demand)
