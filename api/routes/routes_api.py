"""Management API: a route's batch-scheduling settings and live status.

`{id}` is the route id. Settings live durably in the route's RouteSchedulerWorkflow; a PUT is
the scheduler's `set_settings` update, so it takes effect at once without restarting anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from fastapi import APIRouter, Depends, Request
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from api.batches.history_view import quick_query, started_input_and_updates
from api.deps import ClientDep, Identity, IdentityDep, SettingsDep
from api.errors import Forbidden, InvalidRequest, NotFound
from api.preemption.push import PreemptSender
from api.schemas import (
    COMMON_ERRORS,
    BatchScheduling,
    PreemptChannelStatus,
    SchedulingStatus,
    error_responses,
)
from backfill.batches.batch import Batch
from backfill.platform import refs
from backfill.platform.config import RouteConfig, Settings, configured_bases
from backfill.platform.ids import scheduler_workflow_id
from backfill.platform.messages import SchedulerInput
from backfill.platform.refs import RouteSchedulerWorkflow
from backfill.routes import settings as route_settings
from backfill.routes.scheduler_client import scheduler_input, start_scheduler
from backfill.routes.settings import RouteSettings
from backfill.routes.status import BatchStatusEntry, RouteState, SchedulerStatus

log = logging.getLogger(__name__)
router = APIRouter(
    prefix="/api/v1/platform", tags=["admin"], responses=COMMON_ERRORS | error_responses(403, 404)
)


def _route_or_404(settings: Settings, route_id: str) -> RouteConfig:
    route = settings.route(route_id)
    if route is None:
        raise NotFound(f"No such deployment: {route_id}", param="id")
    return route


def require_admin(identity: Identity, *, write: bool) -> None:
    allowed = ("platform_admin",) if write else ("platform_admin", "auditor")
    if identity.role not in allowed:
        raise Forbidden("This needs a platform admin key.", code="insufficient_role")


def _admin_writer(identity: IdentityDep) -> None:
    """A dependency, so the role is checked before the body."""
    require_admin(identity, write=True)


async def _document(
    client: Client, route_id: str, status: SchedulerStatus, request: Request
) -> BatchScheduling:
    lines = await _route_lines(client, route_id, status)
    return BatchScheduling(
        route=route_id,
        settings=status.settings,
        sources=status.sources,
        status=SchedulingStatus(
            **{name: getattr(status, name) for name in RouteState.model_fields},
            running_lines=lines.running,
            preempted_lines=lines.preempted,
            wasted_tokens=lines.wasted_tokens,
            reprefill_tokens=lines.reprefill_tokens,
            preempt_channel=preempt_channel(getattr(request.app.state, "preempt", None)),
        ),
    )


def preempt_channel(sender: PreemptSender | None) -> PreemptChannelStatus | None:
    """What this api process's preemption channel reaches (None: off, no token)."""
    if sender is None:
        return None
    return PreemptChannelStatus(
        workers_found=len(sender.workers),
        workers_reached=len(sender.reached & set(sender.workers)),
    )


@dataclass(frozen=True)
class RouteLines:
    """What the batches on a route count of their lines there, summed."""

    running: int = 0
    """Lines running now (started and not finished), not the allotments."""
    preempted: int = 0
    """Runs ended early for live traffic (preemptive yield)."""
    wasted_tokens: int = 0
    """Tokens those runs had generated, thrown away (an estimate)."""
    reprefill_tokens: int = 0
    """Tokens resumed runs sent again as prompt (decision 0036)."""

    def __add__(self, other: RouteLines) -> RouteLines:
        return RouteLines(
            self.running + other.running,
            self.preempted + other.preempted,
            self.wasted_tokens + other.wasted_tokens,
            self.reprefill_tokens + other.reprefill_tokens,
        )


async def _route_lines(client: Client, route_id: str, status: SchedulerStatus) -> RouteLines:
    """Each batch on the route's own counts (`backfill.routes[]`), summed. A batch that cannot
    answer now counts its allotment as running and nothing preempted."""

    async def one(entry: BatchStatusEntry) -> RouteLines:
        handle = client.get_workflow_handle_for(refs.BatchWorkflow.run, entry.batch_id)
        try:
            batch = await quick_query(handle, refs.BatchWorkflow.describe)
        except Exception:
            return RouteLines(running=min(entry.allotment, entry.held))
        return route_lines(batch, route_id)

    return sum(await asyncio.gather(*(one(b) for b in status.batches)), RouteLines())


def route_lines(batch: Batch, route_id: str) -> RouteLines:
    """A batch's counts on one route (its `backfill.routes[]` entries for it)."""
    return sum(
        (
            RouteLines(r.running_lines, r.preempted_lines, r.wasted_tokens, r.reprefill_tokens)
            for r in batch.backfill.routes
            if r.route == route_id
        ),
        RouteLines(),
    )


async def route_sample(
    client: Client, route_id: str, configured_limit: int, status: SchedulerStatus | None
) -> tuple[int, int, int]:
    """(running lines, limit, live requests in flight) of a route given its scheduler's
    `status`, for the console's chart; a route whose scheduler never started (None) has nothing
    running."""
    if status is None:
        return 0, configured_limit, 0
    lines = await _route_lines(client, route_id, status)
    return lines.running, status.limit, status.live_in_flight


@router.get("/deployments/{route_id}/batch-scheduling", response_model=BatchScheduling)
async def get_batch_scheduling(
    route_id: str,
    request: Request,
    settings: SettingsDep,
    client: ClientDep,
    identity: IdentityDep,
) -> BatchScheduling:
    require_admin(identity, write=False)
    _route_or_404(settings, route_id)
    initial = scheduler_input(settings, route_id)
    handle = client.get_workflow_handle_for(
        RouteSchedulerWorkflow.run, scheduler_workflow_id(route_id)
    )
    stale = False
    try:
        status = await quick_query(handle, RouteSchedulerWorkflow.status, time.time())
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            log.warning("route %s settings from Temporal's record (%s)", route_id, err)
            initial = await _recorded_settings(client, route_id)
            stale = True
        # Never started (no batch yet): the configured settings, nothing running.
        status = SchedulerStatus(
            route_id=route_id,
            settings=initial.settings,
            sources=route_settings.sources_of(initial.settings, initial.sources),
            limit=initial.settings.max_concurrent_lines,
            allotted=0,
            held=0,
            queued_lines=0,
            batches=[],
        )
    doc = await _document(client, route_id, status, request)
    doc.status.stale = stale
    return doc


async def _recorded_settings(client: Client, route_id: str) -> SchedulerInput:
    """The scheduler's settings and their sources without a worker: its current run's input,
    then each `set_settings` update it accepted since, the last one winning (a `configure` signal
    since is not read: its changes show once a worker answers)."""
    inp, updates = await started_input_and_updates(
        client,
        scheduler_workflow_id(route_id),
        SchedulerInput,
        "set_settings",
        RouteSettings,
    )
    for new in updates:
        inp.sources = route_settings.after_put(inp.settings, new, inp.sources)
        inp.settings = new
    return inp


@router.put(
    "/deployments/{route_id}/batch-scheduling",
    response_model=BatchScheduling,
    dependencies=[Depends(_admin_writer)],
)
async def put_batch_scheduling(
    route_id: str, new: RouteSettings, request: Request, settings: SettingsDep, client: ClientDep
) -> BatchScheduling:
    route = _route_or_404(settings, route_id)
    problem = route_settings.settings_problem(
        new, route_id, route.provider, configured_bases(settings)
    )
    if problem is not None:
        raise InvalidRequest(problem[1], param=problem[0])
    handle = await start_scheduler(client, settings, route_id)
    await handle.execute_update(RouteSchedulerWorkflow.set_settings, new)
    status = await handle.query(RouteSchedulerWorkflow.status, time.time())
    return await _document(client, route_id, status, request)
