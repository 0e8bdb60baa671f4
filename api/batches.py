"""OpenAI Batches API (+ pause/resume extensions) over BatchWorkflow."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Annotated, Any, get_args

from fastapi import APIRouter, Body, Query
from pydantic import BaseModel, ConfigDict, ValidationError
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from api.deps import ClientDep, Identity, IdentityDep, SettingsDep, StoreDep
from api.errors import Conflict, InvalidRequest, NotFound
from api.progress import add_route_reasons
from backfill import search_attributes as sa
from backfill.batches import (
    COMPLETION_WINDOWS,
    ENDPOINTS,
    TERMINAL_STATUSES,
    Batch,
    BatchStatus,
)
from backfill.ids import new_batch_id
from workflows.messages import BatchInput, PauseRequest
from workflows.refs import BatchWorkflow

router = APIRouter(prefix="/v1/batches", tags=["batches"])
log = logging.getLogger(__name__)

MAX_METADATA_PAIRS = 16


class CreateBatch(BaseModel):
    model_config = ConfigDict(extra="allow")

    input_file_id: Any = None
    endpoint: Any = None
    completion_window: Any = None
    metadata: Any = None


def _check_create(req: CreateBatch) -> dict[str, str] | None:
    if not isinstance(req.input_file_id, str) or not req.input_file_id:
        raise InvalidRequest("Missing required parameter: 'input_file_id'.", param="input_file_id")
    if req.endpoint not in ENDPOINTS:
        raise InvalidRequest(
            f"Invalid endpoint {req.endpoint!r}: must be one of {', '.join(ENDPOINTS)}.",
            param="endpoint",
        )
    if req.completion_window not in COMPLETION_WINDOWS:
        raise InvalidRequest(
            f"Invalid completion_window {req.completion_window!r}: must be one of "
            f"{', '.join(COMPLETION_WINDOWS)}.",
            param="completion_window",
        )
    meta = req.metadata
    if meta is None:
        return None
    if not isinstance(meta, dict) or len(meta) > MAX_METADATA_PAIRS:
        raise InvalidRequest(
            f"metadata must be an object of at most {MAX_METADATA_PAIRS} pairs.", param="metadata"
        )
    for k, v in meta.items():
        if not isinstance(v, str) or len(k) > 64 or len(v) > 512:
            raise InvalidRequest(
                "metadata keys must be at most 64 characters and values strings of at most 512.",
                param="metadata",
            )
    return meta


@router.post("")
async def create_batch(
    body: Annotated[dict[str, Any], Body()],
    settings: SettingsDep,
    client: ClientDep,
    store: StoreDep,
    identity: IdentityDep,
) -> dict[str, Any]:
    identity.require_write()
    try:
        req = CreateBatch.model_validate(body)
    except ValidationError as err:
        raise InvalidRequest(str(err)) from None
    metadata = _check_create(req)
    file = store.get_file(req.input_file_id)
    if file is None or file.workspace != identity.workspace:
        raise NotFound(
            f"No such File object: {req.input_file_id}", param="input_file_id", code="invalid_file"
        )
    if file.purpose != "batch":
        raise InvalidRequest(
            f"File {file.id} has purpose {file.purpose!r}; a batch needs purpose 'batch'.",
            param="input_file_id",
        )
    # One clock reading for both, so newest-first by (created_at, id) matches creation order.
    now_ms = int(time.time() * 1000)
    now = now_ms // 1000
    batch_id = new_batch_id(now_ms)
    store.snapshot_input(batch_id, file.id)
    allowed = None
    inp = BatchInput(
        batch_id=batch_id,
        workspace=identity.workspace,
        input_file_id=file.id,
        endpoint=req.endpoint,
        completion_window=req.completion_window,
        created_at=now,
        metadata=metadata,
        allowed_models=allowed,
        line_timeout_seconds=settings.limits.line_timeout_seconds,
        max_line_retries=settings.limits.max_line_retries,
    )
    await client.start_workflow(
        BatchWorkflow.run,
        inp,
        id=batch_id,
        task_queue=settings.task_queue,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(sa.WORKSPACE, identity.workspace),
                SearchAttributePair(sa.STATUS, "validating"),
                SearchAttributePair(sa.ENDPOINT, req.endpoint),
                SearchAttributePair(sa.CREATED_AT, now),
            ]
        ),
        memo={"workspace": identity.workspace},
        static_summary=f"{req.endpoint} batch of {file.filename} ({identity.workspace})",
    )
    return _public(BatchWorkflow.initial_batch(inp))


@router.get("")
async def list_batches(
    client: ClientDep,
    identity: IdentityDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    # SQL visibility ignores ORDER BY, so order here: newest first by (created_at, id).
    query = (
        f"WorkflowType = 'BatchWorkflow' AND {sa.WORKSPACE.name} = '{_quote(identity.workspace)}'"
    )
    rows: dict[str, tuple[int, str]] = {}
    async for ex in client.list_workflows(query, page_size=1000):
        if ex.status == WorkflowExecutionStatus.CONTINUED_AS_NEW:
            continue
        created = ex.typed_search_attributes.get(sa.CREATED_AT) or 0
        rows[ex.id] = (int(created), ex.id)
    ordered = sorted(rows.values(), reverse=True)
    if after is not None:
        if after not in rows:
            raise InvalidRequest(f"No such batch for 'after': {after}", param="after")
        ordered = [r for r in ordered if r < rows[after]]
    page = ordered[:limit]
    batches = await asyncio.gather(*(_load_or_stub(client, batch_id) for _, batch_id in page))
    data = [_public(b) for b in batches]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) > limit,
    }


@router.get("/{batch_id}")
async def retrieve_batch(batch_id: str, client: ClientDep, identity: IdentityDep) -> dict[str, Any]:
    desc = await _describe(client, identity, batch_id)
    batch = await _load(client, batch_id, desc)
    if batch.status not in TERMINAL_STATUSES:
        await add_route_reasons(client, batch, desc)
    return _public(batch)


@router.post("/{batch_id}/cancel")
async def cancel_batch(batch_id: str, client: ClientDep, identity: IdentityDep) -> dict[str, Any]:
    identity.require_write()
    desc = await _describe(client, identity, batch_id)
    batch = await _load(client, batch_id, desc)
    if batch.status in TERMINAL_STATUSES:
        raise Conflict(
            f"Cannot cancel a batch with status '{batch.status}'.", code="invalid_batch_status"
        )
    handle = client.get_workflow_handle_for(BatchWorkflow.run, batch_id)
    return _public(await handle.execute_update(BatchWorkflow.cancel_now))


@router.post("/{batch_id}/pause")
async def pause_batch(batch_id: str, client: ClientDep, identity: IdentityDep) -> dict[str, Any]:
    return await _control(client, identity, batch_id, pause=True)


@router.post("/{batch_id}/resume")
async def resume_batch(batch_id: str, client: ClientDep, identity: IdentityDep) -> dict[str, Any]:
    return await _control(client, identity, batch_id, pause=False)


async def _control(client: Client, identity: Identity, batch_id: str, *, pause: bool) -> dict:  # type: ignore[type-arg]
    identity.require_write()
    desc = await _describe(client, identity, batch_id)
    batch = await _load(client, batch_id, desc)
    if batch.status not in ("validating", "in_progress"):
        verb = "pause" if pause else "resume"
        raise Conflict(
            f"Cannot {verb} a batch with status '{batch.status}'.", code="invalid_batch_status"
        )
    handle = client.get_workflow_handle_for(BatchWorkflow.run, batch_id)
    if pause:
        await handle.signal(BatchWorkflow.pause, PauseRequest(by=identity.key_name))
    else:
        await handle.signal(BatchWorkflow.resume)
    # The signal is in history before we query, so the answer includes it.
    return _public(await handle.query(BatchWorkflow.describe))


async def _describe(
    client: Client, identity: Identity, batch_id: str
) -> WorkflowExecutionDescription:
    not_found = NotFound(f"No such Batch object: {batch_id}", param="batch_id")
    if not batch_id.startswith("batch_"):
        raise not_found
    try:
        desc = await client.get_workflow_handle(batch_id).describe()
    except RPCError as err:
        if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
            raise not_found from None
        raise
    if desc.workflow_type != "BatchWorkflow" or not identity.can_see(
        desc.typed_search_attributes.get(sa.WORKSPACE)
    ):
        raise not_found
    return desc


async def _load(
    client: Client, batch_id: str, desc: WorkflowExecutionDescription | None = None
) -> Batch:
    """The Batch object: the result of a completed workflow, else the workflow's own query."""
    handle = client.get_workflow_handle_for(BatchWorkflow.run, batch_id)
    if desc is None:
        desc = await handle.describe()
    if desc.status == WorkflowExecutionStatus.COMPLETED:
        return await handle.result()
    batch = await handle.query(BatchWorkflow.describe)
    if desc.status in (WorkflowExecutionStatus.TERMINATED, WorkflowExecutionStatus.CANCELED):
        # Stopped from outside (Temporal UI / CLI): no files were assembled.
        if batch.status not in TERMINAL_STATUSES:
            batch.status = "cancelled"
            batch.cancelled_at = int(desc.close_time.timestamp()) if desc.close_time else None
    elif desc.status in (WorkflowExecutionStatus.FAILED, WorkflowExecutionStatus.TIMED_OUT):
        if batch.status not in TERMINAL_STATUSES:
            batch.status = "failed"
            batch.failed_at = int(desc.close_time.timestamp()) if desc.close_time else None
    return batch


async def _load_or_stub(client: Client, batch_id: str) -> Batch:
    """For listings: one batch that cannot be read right now (no worker to answer its query)
    must not fail the whole page; it is listed from its search attributes instead."""
    try:
        return await _load(client, batch_id)
    except Exception as err:
        log.warning("listing %s from its search attributes: %s", batch_id, err)
        desc = await client.get_workflow_handle(batch_id).describe()
        attrs = desc.typed_search_attributes
        created = attrs.get(sa.CREATED_AT) or int(desc.start_time.timestamp())
        status = attrs.get(sa.STATUS) or "in_progress"
        return Batch(
            id=batch_id,
            endpoint=attrs.get(sa.ENDPOINT) or "",
            input_file_id="",
            completion_window="",
            status=status if status in get_args(BatchStatus) else "in_progress",  # type: ignore[arg-type]
            created_at=int(created),
        )


def _public(batch: Batch) -> dict[str, Any]:
    return batch.model_dump(mode="json")


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


__all__ = ["router", "RPCStatusCode"]
