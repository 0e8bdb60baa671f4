"""Batches: the list (filters, paging), one batch's page with its controls, and downloads.

Every read and change goes through the JSON API's functions with the session's identity, so
visibility (a member sees its workspace, an admin or auditor every one), the auditor's read-only
role and the content rule are the API's own.
"""

from __future__ import annotations

import asyncio
import time
from typing import get_args

from fastapi import Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse

from api.batches import batches_api as batches
from api.batches import reads as batch_reads
from api.console.lists import Action, ListQueryDep, control, render_list
from api.console.web import SessionDep, render, router
from api.deps import BuffersDep, ClientDep, SettingsDep, StoreDep
from api.files import files_api as files
from api.platform_admin.batches import batch_filters
from backfill.batches.batch import TERMINAL_STATUSES, Batch, BatchStatus
from backfill.batches.jobs import is_job

STATUSES: tuple[str, ...] = get_args(BatchStatus)
CONTROLLABLE = ("validating", "in_progress")
"""Statuses in which pause and resume are accepted (cancel: any status not terminal)."""


def why_it_waits(batch: Batch) -> list[str]:
    """Plain-text reasons a batch's lines are not running (empty when nothing waits)."""
    ext = batch.backfill
    if batch.status in TERMINAL_STATUSES:
        return []
    out = []
    if ext.paused:
        out.append(f"Paused by {ext.paused_by or 'operator'}")
    elif ext.summary:
        out.append(ext.summary)
    for r in ext.routes:
        if r.reason:
            place = f" (place {r.queue_position} in the queue)" if r.queue_position else ""
            out.append(f"{r.route}: {r.shown_reason()}{place}")
    return out


def actions(batch: Batch, role: str) -> list[str]:
    """The controls this role may use on this batch now (the server checks again)."""
    if role == "auditor" or batch.status in TERMINAL_STATUSES:
        return []
    out = []
    if batch.status in CONTROLLABLE:
        out.append("resume" if batch.backfill.paused else "pause")
    if batch.status != "cancelling":
        out.append("cancel")
    return out


async def _with_reasons(client: ClientDep, session: SessionDep, batch: Batch) -> Batch:
    """The batch as `GET /v1/batches/{id}` serves it (with why its lines wait), for rows still
    running; the listed object when it cannot be read again."""
    if batch.status in TERMINAL_STATUSES:
        return batch
    try:
        return await batches.retrieve_batch(batch.id, client, session.identity)
    except Exception:
        return batch


@router.get("/batches", response_model=None)
async def batches_page(
    request: Request,
    session: SessionDep,
    client: ClientDep,
    settings: SettingsDep,
    query: ListQueryDep,
    status: str = "",
) -> Response:
    filters = batch_filters(query.workspace_for(session), status or None, query.model or None)
    page = await batch_reads.list_page(client, filters, after=query.after, limit=query.limit)
    rows = await asyncio.gather(*(_with_reasons(client, session, b) for b in page.data))
    return render_list(
        request,
        "batches.html",
        session,
        settings,
        query,
        rows=rows,
        has_more=page.has_more,
        last_id=page.last_id,
        own={"status": status},
        statuses=STATUSES,
        now=time.time(),
        why_it_waits=why_it_waits,
        is_job=lambda b: is_job(b.metadata),
    )


@router.get("/batches/{batch_id}", response_model=None)
async def batch_page(
    request: Request, batch_id: str, session: SessionDep, client: ClientDep
) -> Response:
    batch = await batches.retrieve_batch(batch_id, client, session.identity)
    return render(
        request,
        "batch.html",
        session,
        batch=batch,
        now=time.time(),
        actions=actions(batch, session.identity.role),
        why=why_it_waits(batch),
    )


@router.post("/batches/{batch_id}/{action}", response_model=None)
async def control_batch(
    request: Request, batch_id: str, action: Action, session: SessionDep, client: ClientDep
) -> RedirectResponse:
    do = {
        "pause": batches.pause_batch,
        "resume": batches.resume_batch,
        "cancel": batches.cancel_batch,
    }[action]
    return await control(
        request,
        session,
        f"batches/{batch_id}",
        action,
        lambda: do(batch_id, client, session.identity),
    )


@router.get("/files/{file_id}/content", response_model=None)
async def download(
    file_id: str, session: SessionDep, store: StoreDep, buffers: BuffersDep
) -> StreamingResponse:
    """A file's bytes through the session (the same checks as `GET /v1/files/{id}/content`)."""
    return await files.file_content(file_id, store, session.identity, buffers)
