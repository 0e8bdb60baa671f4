"""Reaching a route's scheduler from any process: start it (lazily, with the configured
settings) and signal a batch's demand in the same call (signal-with-start). The api uses it to
read and change a route's settings; the `report_demand` activity to register a batch."""

from __future__ import annotations

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy

from backfill import refs
from backfill.config import Settings
from backfill.ids import scheduler_workflow_id
from backfill.messages import Demand, DemandInput, RouteSettings, SchedulerInput


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
        expires_at=input.expires_at,
        line_seconds=input.line_seconds,
    )
    await start_scheduler(client, settings, input.route_id, demand)
