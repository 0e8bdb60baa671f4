"""Webhooks: a workspace's endpoints and its latest deliveries, over the JSON API's own handlers
(`api.webhooks.webhooks_api`). A member sees its own workspace; platform admins and auditors pick
one. Endpoints are made, deleted and rotated through the API (the secret is shown once there)."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import Request
from fastapi.responses import Response

from api.console.web import SessionDep, render, router
from api.deps import ClientDep, SettingsDep
from api.webhooks import webhooks_api as webhooks


def when(ts: int | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S") if ts else ""


@router.get("/webhooks", response_model=None)
async def webhooks_page(
    request: Request,
    session: SessionDep,
    client: ClientDep,
    settings: SettingsDep,
    workspace: str = "",
) -> Response:
    identity = session.identity
    ws = (workspace or identity.workspace) if identity.can_see(None) else identity.workspace
    webhooks.may_read(ws, identity)  # the API's own access rule
    endpoints = await webhooks.list_endpoints(ws, settings, client, identity)
    log = await webhooks.list_deliveries(ws, client, identity, limit=20)
    return render(
        request,
        "webhooks.html",
        session,
        workspace=ws,
        endpoints=endpoints.data,
        deliveries=log.data,
        when=when,
    )
