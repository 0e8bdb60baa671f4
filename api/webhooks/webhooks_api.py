"""Webhook endpoints and their delivery log, per workspace: `/api/v1/workspaces/{ws}/webhooks`.

Platform admins make, delete and rotate endpoints of any workspace; the workspace's members
(and auditors, for any workspace) read its endpoints and delivery log; a workspace the caller may
not see answers 404. Endpoints made here live in the workspace's `WebhookEndpointsWorkflow`;
endpoints configured in the file (`[[webhooks]]`) are listed too, read-only. An endpoint's
signing secret is shown once, when it is made or rotated: it is derived from the operator's
`BACKFILL_WEBHOOK_KEY` and never stored (docs/decisions/0021). The objects have the shape of the
openai SDK's `WebhookEndpoint`, `WebhookEndpointWithSecret` and `DeletedWebhookEndpoint`.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, Field
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from api.deps import ClientDep, Identity, IdentityDep, SettingsDep
from api.errors import Conflict, Forbidden, InvalidRequest, NotFound
from api.schemas import COMMON_ERRORS, error_responses
from backfill.batches import search_attributes as sa
from backfill.platform import refs
from backfill.platform.config import Settings, configured_endpoints
from backfill.webhooks.endpoint_reads import endpoints_made
from backfill.webhooks.events import (
    DELIVERIES_MEMO,
    EVENT_TYPES,
    EndpointId,
    EndpointsInput,
    EventDeliveries,
    EventType,
    WebhookEndpoint,
    check_url,
    derive_secret,
    endpoints_workflow_id,
    refusal,
    secret_hint,
)

router = APIRouter(
    prefix="/api/v1/workspaces/{workspace}/webhooks",
    tags=["webhooks"],
    responses=COMMON_ERRORS | error_responses(403, 404),
)

Workspace = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]


class WebhookEndpointCreate(BaseModel):
    """A new endpoint: where, which events, a label."""

    model_config = {"extra": "forbid"}

    url: str = Field(max_length=2048)
    """The URL deliveries are POSTed to (https, or http for a receiver on a trusted network)."""
    event_types: list[EventType] = Field(default_factory=lambda: list(EVENT_TYPES), min_length=1)
    name: str = Field(default="", max_length=256)


class WebhookEndpointObject(BaseModel):
    """An endpoint, without its secret."""

    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    id: str
    url: str
    name: str
    event_types: list[EventType]
    created_at: int
    updated_at: int | None = None
    signing_secret_hint: str | None = None
    """The secret's last characters (None for a configured endpoint or without the key)."""
    source: Literal["api", "config"]
    """`config`: from the config file, changed only there."""


class WebhookEndpointWithSecret(WebhookEndpointObject):
    signing_secret: str
    """`whsec_…`: shown here only, when made or rotated. Verify deliveries with it (e.g. the
    openai SDK's `client.webhooks.unwrap(body, headers, secret=...)`)."""


class WebhookEndpointList(BaseModel):
    object: Literal["list"] = "list"
    data: list[WebhookEndpointObject]


class DeletedWebhookEndpoint(BaseModel):
    object: Literal["webhook_endpoint.deleted"] = "webhook_endpoint.deleted"
    id: str
    deleted: bool = True


class WebhookDeliveryList(BaseModel):
    """Events of the workspace that had endpoints to go to, newest first, each with its
    deliveries (state, attempts, the latest attempts' time, HTTP status or error, next retry)."""

    object: Literal["list"] = "list"
    data: list[EventDeliveries]


def may_read(workspace: Workspace, identity: IdentityDep) -> Identity:
    if not identity.can_see(workspace):
        raise NotFound(f"No such workspace: {workspace}", param="workspace")
    return identity


def _admin(identity: Annotated[Identity, Depends(may_read)]) -> Identity:
    if identity.role != "platform_admin":
        raise Forbidden(
            "Webhook endpoints are made by a platform admin key.", code="insufficient_role"
        )
    return identity


Reader = Annotated[Identity, Depends(may_read)]
Admin = Annotated[Identity, Depends(_admin)]


def _object(settings: Settings, workspace: str, e: WebhookEndpoint) -> WebhookEndpointObject:
    hint = None
    if e.source == "api" and settings.webhook_key:
        hint = secret_hint(derive_secret(settings.webhook_key, workspace, e.id, e.rotation))
    return WebhookEndpointObject(
        id=e.id,
        url=e.url,
        name=e.name,
        event_types=e.event_types,
        created_at=e.created_at,
        updated_at=e.updated_at,
        signing_secret_hint=hint,
        source=e.source,
    )


def _with_secret(
    settings: Settings, workspace: str, e: WebhookEndpoint
) -> WebhookEndpointWithSecret:
    assert settings.webhook_key is not None
    secret = derive_secret(settings.webhook_key, workspace, e.id, e.rotation)
    return WebhookEndpointWithSecret(
        **_object(settings, workspace, e).model_dump(), signing_secret=secret
    )


async def _made(client: Client, workspace: str) -> list[WebhookEndpoint]:
    return await endpoints_made(client, workspace)


@router.get("", response_model=WebhookEndpointList)
async def list_endpoints(
    workspace: Workspace, settings: SettingsDep, client: ClientDep, _: Reader
) -> WebhookEndpointList:
    """The workspace's endpoints: configured ones first, then those made here."""
    endpoints = configured_endpoints(settings, workspace) + await _made(client, workspace)
    return WebhookEndpointList(data=[_object(settings, workspace, e) for e in endpoints])


@router.post("", response_model=WebhookEndpointWithSecret, responses=error_responses(409))
async def create_endpoint(
    workspace: Workspace,
    new: WebhookEndpointCreate,
    settings: SettingsDep,
    client: ClientDep,
    _: Admin,
) -> WebhookEndpointWithSecret:
    """Make an endpoint; the answer holds its signing secret, shown only this once."""
    _need_key(settings)
    try:
        host = check_url(new.url)[1]
    except ValueError as err:
        raise InvalidRequest(f"Invalid url: {err}.", param="url") from None
    why = _literal_refusal(settings, host)
    if why is not None:
        raise InvalidRequest(f"Invalid url: {why}.", param="url", code="destination_refused")
    handle = await client.start_workflow(
        refs.WebhookEndpointsWorkflow.run,
        EndpointsInput(workspace=workspace),
        id=endpoints_workflow_id(workspace),
        task_queue=settings.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    endpoint = WebhookEndpoint(
        id=f"we_{secrets.token_hex(12)}",
        url=new.url,
        event_types=list(dict.fromkeys(new.event_types)),
        name=new.name,
    )
    try:
        made = await handle.execute_update(refs.WebhookEndpointsWorkflow.add, endpoint)
    except WorkflowUpdateFailedError as err:
        raise _refused(err) from None
    return _with_secret(settings, workspace, made)


@router.delete("/{endpoint_id}", response_model=DeletedWebhookEndpoint)
async def delete_endpoint(
    workspace: Workspace, endpoint_id: str, settings: SettingsDep, client: ClientDep, _: Admin
) -> DeletedWebhookEndpoint:
    """Delete an endpoint: no new event goes to it (events raised before still try it)."""
    await _change(settings, client, workspace, endpoint_id, rotate=False)
    return DeletedWebhookEndpoint(id=endpoint_id)


@router.post("/{endpoint_id}/rotate_secret", response_model=WebhookEndpointWithSecret)
async def rotate_secret(
    workspace: Workspace, endpoint_id: str, settings: SettingsDep, client: ClientDep, _: Admin
) -> WebhookEndpointWithSecret:
    """A new signing secret for the endpoint (the old one stops at once), shown only here."""
    _need_key(settings)
    endpoint = await _change(settings, client, workspace, endpoint_id, rotate=True)
    return _with_secret(settings, workspace, endpoint)


@router.get("/deliveries", response_model=WebhookDeliveryList)
async def list_deliveries(
    workspace: Workspace,
    client: ClientDep,
    _: Reader,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> WebhookDeliveryList:
    """The delivery log: the workspace's latest events and how each delivery went."""
    query = (
        f"WorkflowType = 'WebhookEventWorkflow' AND {sa.WORKSPACE.name} = '{sa.quote(workspace)}'"
    )
    found: list[EventDeliveries] = []
    async for ex in client.list_workflows(query, limit=limit):
        memo = await ex.memo_value(DELIVERIES_MEMO, None)
        if memo is not None:
            found.append(EventDeliveries.model_validate(memo))
    found.sort(key=lambda d: (d.event.created_at, d.event.id), reverse=True)
    return WebhookDeliveryList(data=found)


def _need_key(settings: Settings) -> None:
    if not settings.webhook_key:
        raise Conflict(
            "Webhook endpoints cannot be made here: the operator has not set "
            "BACKFILL_WEBHOOK_KEY (docs/operator-guide.md).",
            code="webhooks_not_configured",
        )


def _literal_refusal(settings: Settings, host: str) -> str | None:
    """An address written in the URL is checked at once (names are checked at each delivery,
    where they are resolved)."""
    try:
        return refusal(host, host.strip("[]"), settings.webhook_destinations)
    except ValueError:
        return None


async def _change(
    settings: Settings, client: Client, workspace: str, endpoint_id: str, *, rotate: bool
) -> WebhookEndpoint:
    """Remove the endpoint, or rotate its secret; 404 for an endpoint that does not exist."""
    if any(e.id == endpoint_id for e in configured_endpoints(settings, workspace)):
        raise InvalidRequest(
            f"Endpoint {endpoint_id} is configured in the config file; change it there.",
            param="endpoint_id",
        )
    handle = client.get_workflow_handle_for(
        refs.WebhookEndpointsWorkflow.run, endpoints_workflow_id(workspace)
    )
    try:
        ref = EndpointId(id=endpoint_id)
        if rotate:
            return await handle.execute_update(refs.WebhookEndpointsWorkflow.rotate, ref)
        return await handle.execute_update(refs.WebhookEndpointsWorkflow.remove, ref)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise _no_endpoint(endpoint_id) from None
        raise
    except WorkflowUpdateFailedError as err:
        raise _refused(err) from None


def _no_endpoint(endpoint_id: str) -> NotFound:
    return NotFound(f"No such webhook endpoint: {endpoint_id}", param="endpoint_id")


def _refused(err: WorkflowUpdateFailedError) -> Exception:
    """The endpoints workflow's refusal, by its type."""
    cause = err.cause
    if isinstance(cause, ApplicationError):
        if cause.type == "not_found":
            return NotFound(cause.message, param="endpoint_id")
        if cause.type in ("too_many", "conflict"):
            return Conflict(cause.message, code=cause.type)
    return err
