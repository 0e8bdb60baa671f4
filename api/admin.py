"""Management API: a route's batch-scheduling settings and live status.

`{id}` is the route id. Settings live durably in the route's RouteSchedulerWorkflow; a PUT is
the scheduler's `set_settings` update, so it takes effect at once without restarting anything.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body
from pydantic import ValidationError
from temporalio.service import RPCError, RPCStatusCode

from activities.control import start_scheduler
from api.deps import ClientDep, Identity, IdentityDep, SettingsDep
from api.errors import Forbidden, InvalidRequest, NotFound
from backfill.config import Settings
from backfill.ids import scheduler_workflow_id
from workflows.messages import RouteSettings, SchedulerStatus
from workflows.refs import RouteSchedulerWorkflow

router = APIRouter(prefix="/api/v1/platform", tags=["admin"])


def _route_or_404(settings: Settings, route_id: str) -> RouteSettings:
    route = settings.route(route_id)
    if route is None:
        raise NotFound(f"No such deployment: {route_id}", param="id")
    return RouteSettings(max_concurrent_lines=route.max_concurrent_lines)


def _require_admin(identity: Identity, *, write: bool) -> None:
    allowed = ("platform_admin",) if write else ("platform_admin", "auditor")
    if identity.role not in allowed:
        raise Forbidden("This needs a platform admin key.", code="insufficient_role")


def _document(route_id: str, status: SchedulerStatus) -> dict[str, Any]:
    return {
        "route": route_id,
        "settings": status.settings.model_dump(),
        "status": {
            "queued_lines": status.queued_lines,
            "running_lines": status.allotted,
            "limit": status.limit,
            "state": "open",
            "reason": None,
            "batches": [b.model_dump() for b in status.batches],
        },
    }


@router.get("/deployments/{route_id}/batch-scheduling")
async def get_batch_scheduling(
    route_id: str, settings: SettingsDep, client: ClientDep, identity: IdentityDep
) -> dict[str, Any]:
    _require_admin(identity, write=False)
    initial = _route_or_404(settings, route_id)
    handle = client.get_workflow_handle_for(
        RouteSchedulerWorkflow.run, scheduler_workflow_id(route_id)
    )
    try:
        status = await handle.query(RouteSchedulerWorkflow.status)
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        # Never started (no batch yet): the configured defaults, nothing running.
        status = SchedulerStatus(
            route_id=route_id,
            settings=initial,
            limit=initial.max_concurrent_lines,
            allotted=0,
            held=0,
            queued_lines=0,
            batches=[],
        )
    return _document(route_id, status)


@router.put("/deployments/{route_id}/batch-scheduling")
async def put_batch_scheduling(
    route_id: str,
    body: Annotated[dict[str, Any], Body()],
    settings: SettingsDep,
    client: ClientDep,
    identity: IdentityDep,
) -> dict[str, Any]:
    _require_admin(identity, write=True)
    _route_or_404(settings, route_id)
    try:
        new = RouteSettings.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise InvalidRequest(f"{param}: {first['msg']}", param=param) from None
    handle = await start_scheduler(client, settings, route_id)
    await handle.execute_update(RouteSchedulerWorkflow.set_settings, new)
    return _document(route_id, await handle.query(RouteSchedulerWorkflow.status))
