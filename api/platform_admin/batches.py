"""Admin API over every workspace: `/api/v1/admin/batches` and `/api/v1/admin/files`.

Platform admins list, read and control any workspace's batches; auditors list and read only
(403 on every change). Members get 403 `insufficient_role`. The listing is `/v1/batches`'s own
code (`batch_reads.list_page`) with more filters; the per-batch routes are `/v1/batches`' handlers,
which already let these roles see every workspace.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, get_args

from fastapi import APIRouter, Depends, Query

from api.batches import batches_api as batches
from api.batches import reads as batch_reads
from api.deps import ClientDep, Identity, IdentityDep, StoreDep
from api.errors import Forbidden, InvalidRequest
from api.files import files_api
from api.listing_params import check_after, check_filter
from api.schemas import COMMON_ERRORS, BatchList, FileList, error_responses
from backfill.batches import search_attributes as sa
from backfill.batches.batch import Batch, BatchStatus


def require_admin_reader(identity: IdentityDep) -> Identity:
    """A platform admin or an auditor: a dependency, checked before anything else."""
    if identity.role not in ("platform_admin", "auditor"):
        raise Forbidden("This needs a platform admin or auditor key.", code="insufficient_role")
    return identity


AdminReaderDep = Annotated[Identity, Depends(require_admin_reader)]

router = APIRouter(
    prefix="/api/v1/admin",
    tags=["admin"],
    responses=COMMON_ERRORS | error_responses(403),
)


@router.get("/batches", response_model=BatchList)
async def list_all_batches(
    client: ClientDep,
    identity: AdminReaderDep,
    workspace: str | None = None,
    status: str | None = None,
    model: str | None = None,
    created_after: Annotated[int | None, Query(ge=0)] = None,
    created_before: Annotated[int | None, Query(ge=0)] = None,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> BatchList:
    """Every workspace's batches, newest first, filtered by workspace, status, model and
    creation time (`created_after` <= created_at < `created_before`, Unix seconds)."""
    filters = batch_filters(workspace, status, model, created_after, created_before)
    return await batch_reads.list_page(client, filters, after=after, limit=limit)


def batch_filters(
    workspace: str | None = None,
    status: str | None = None,
    model: str | None = None,
    created_after: int | None = None,
    created_before: int | None = None,
) -> str:
    """The visibility query for these filters ("" for none); 400 `param: status` for an unknown
    status, naming `workspace` or `model` for a value no query may hold (`check_filter`).
    Shared by this listing and the console's (which pins a member to its workspace)."""
    filters = []
    if workspace is not None:
        value = sa.quote(check_filter(workspace, "workspace"))
        filters.append(f"{sa.WORKSPACE.name} = '{value}'")
    if status is not None:
        if status not in get_args(BatchStatus):
            raise InvalidRequest(f"Unknown batch status {status!r}.", param="status")
        filters.append(f"{sa.STATUS.name} = '{status}'")
    if model is not None:
        filters.append(f"{sa.MODELS.name} = '{sa.quote(check_filter(model, 'model'))}'")
    if created_after is not None:
        filters.append(f"{sa.CREATED_AT.name} >= {created_after}")
    if created_before is not None:
        filters.append(f"{sa.CREATED_AT.name} < {created_before}")
    return " AND ".join(filters)


@router.get("/batches/{batch_id}", response_model=Batch, responses=error_responses(404))
async def retrieve_any_batch(batch_id: str, client: ClientDep, identity: AdminReaderDep) -> Batch:
    return await batches.retrieve_batch(batch_id, client, identity)


@router.post(
    "/batches/{batch_id}/cancel", response_model=Batch, responses=error_responses(404, 409)
)
async def cancel_any_batch(batch_id: str, client: ClientDep, identity: AdminReaderDep) -> Batch:
    return await batches.cancel_batch(batch_id, client, identity)


@router.post("/batches/{batch_id}/pause", response_model=Batch, responses=error_responses(404, 409))
async def pause_any_batch(batch_id: str, client: ClientDep, identity: AdminReaderDep) -> Batch:
    return await batches.pause_batch(batch_id, client, identity)


@router.post(
    "/batches/{batch_id}/resume", response_model=Batch, responses=error_responses(404, 409)
)
async def resume_any_batch(batch_id: str, client: ClientDep, identity: AdminReaderDep) -> Batch:
    return await batches.resume_batch(batch_id, client, identity)


@router.get("/files", response_model=FileList)
async def list_workspace_files(
    store: StoreDep,
    identity: AdminReaderDep,
    workspace: str | None = None,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
) -> FileList:
    """File metadata (never content) of one workspace, or of every workspace; newest first."""
    check_after(after, "file")
    files = await asyncio.to_thread(store.list_files, workspace)
    return files_api.file_page(files, after=after, limit=limit)
