"""Reaching a route's scheduler from any process: start it (lazily, with the configured
settings) and signal a batch's demand in the same call (signal-with-start). The api uses it to
read and change a route's settings; the `report_demand` activity to register a batch."""

from __future__ import annotations

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from backfill.platform import refs
from backfill.platform.config import Settings
from backfill.platform.ids import scheduler_workflow_id
from backfill.platform.messages import Demand, DemandInput, SchedulerInput
from backfill.routes import settings as route_settings
from backfill.routes.gates.cap import DEFAULT_LINES_AT_ONCE
from backfill.routes.settings import ConfiguredSettings


async def start_scheduler(
    client: Client, settings: Settings, route_id: str, demand: Demand | None = None
) -> WorkflowHandle[refs.RouteSchedulerWorkflow, None]:
    """The route's scheduler, started unless it runs (the configured settings are its initial
    ones); with `demand`, signalled in the same call (signal-with-start)."""
    return await client.start_workflow(
        refs.RouteSchedulerWorkflow.run,
        scheduler_input(settings, route_id),
        id=scheduler_workflow_id(route_id),
        task_queue=settings.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        start_signal=None
        if demand is None
        else refs.signal_name(refs.RouteSchedulerWorkflow.demand),
        start_signal_args=[] if demand is None else [demand],
    )


def scheduler_input(settings: Settings, route_id: str) -> SchedulerInput:
    """A new scheduler's input: the route's settings as the config file declares them (its
    `settings` table and its `max_concurrent_lines`), with their sources."""
    route = settings.route(route_id)
    applied = route_settings.initial(
        route.configured() if route else ConfiguredSettings(cap=DEFAULT_LINES_AT_ONCE)
    )
    return SchedulerInput(
        route_id=route_id,
        settings=applied.settings,
        sources=applied.sources,
        configured=applied.declared,
        reconcile_seconds=settings.scheduler_reconcile_seconds,
    )


async def configure_routes(client: Client, settings: Settings) -> None:
    """Send each configured route's scheduler the config file's settings for it (`configure`),
    at worker start: a route with a `settings` table gets its scheduler started with them if it
    is not running; a route without one only tells a running scheduler (which then drops the
    fields an earlier table set). The scheduler applies a table only when it differs from the
    one it last applied (`backfill.routes.settings.apply_config`)."""
    for model in settings.models:
        for route in model.routes:
            configured = route.configured()
            if route.settings is not None:
                await client.start_workflow(
                    refs.RouteSchedulerWorkflow.run,
                    scheduler_input(settings, route.id),
                    id=scheduler_workflow_id(route.id),
                    task_queue=settings.task_queue,
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    start_signal=refs.signal_name(refs.RouteSchedulerWorkflow.configure),
                    start_signal_args=[configured],
                )
                continue
            handle = client.get_workflow_handle_for(
                refs.RouteSchedulerWorkflow.run, scheduler_workflow_id(route.id)
            )
            try:
                await handle.signal(refs.RouteSchedulerWorkflow.configure, configured)
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    raise


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
