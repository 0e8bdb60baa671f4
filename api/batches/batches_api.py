"""OpenAI Batches API (+ pause/resume extensions) over BatchWorkflow."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Annotated

from fastapi import APIRouter, Query
from temporalio.client import (
    Client,
    WorkflowUpdateFailedError,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from api.batches.eta import fill_eta
from api.batches.input_scan import scan_input
from api.batches.reads import describe_batch, list_page, load_batch, workspace_of
from api.batches.retries import retries_of, retry_link
from api.batches.submit_estimate import estimate_at_submit, history_of
from api.deps import ClientDep, Identity, IdentityDep, SettingsDep, StoreDep, WriterDep
from api.errors import Conflict, InvalidRequest, NotFound
from api.platform_admin import audit
from api.schemas import COMMON_ERRORS, BatchList, CreateBatch, error_responses
from api.tenancy import admission
from backfill.batches import search_attributes as sa
from backfill.batches.batch import COMPLETION_WINDOWS, TERMINAL_STATUSES, Batch
from backfill.batches.jobs import JOB_METADATA_KEY, job_memo
from backfill.batches.lifecycle import SUMMARY_MEMO, initial_batch
from backfill.batches.progress import add_route_reasons
from backfill.files import FileObject as StoredFile
from backfill.files import Store
from backfill.platform import tracing
from backfill.platform.config import Settings
from backfill.platform.ids import new_batch_id
from backfill.platform.messages import BatchInput, PauseRequest
from backfill.platform.refs import BatchWorkflow
from backfill.tenancy.admission import ReserveRequest

router = APIRouter(prefix="/v1/batches", tags=["batches"], responses=COMMON_ERRORS)
log = logging.getLogger(__name__)


@router.post("", response_model=Batch, responses=error_responses(403, 404, 429))
async def create_batch(
    req: CreateBatch,
    settings: SettingsDep,
    client: ClientDep,
    store: StoreDep,
    identity: WriterDep,
) -> Batch:
    refuse_reserved_metadata(req.metadata)
    file = await asyncio.to_thread(store.get_file, req.input_file_id)
    if file is None or file.workspace != identity.workspace:
        raise NotFound(
            f"No such File object: {req.input_file_id}", param="input_file_id", code="invalid_file"
        )
    if file.purpose != "batch":
        raise InvalidRequest(
            f"File {file.id} has purpose {file.purpose!r}; a batch needs purpose 'batch'.",
            param="input_file_id",
        )
    return await start_batch(req, file, settings, client, store, identity)


def refuse_reserved_metadata(metadata: dict[str, str] | None) -> None:
    """400 (param `metadata`) for metadata that sets a key only the gateway sets: the job
    marker (`backfill.batches.jobs.JOB_METADATA_KEY`), which `/gateway/v1/batches` adds itself."""
    if metadata and JOB_METADATA_KEY in metadata:
        raise InvalidRequest(
            f"The metadata key {JOB_METADATA_KEY!r} is reserved.", param="metadata"
        )


async def start_batch(
    req: CreateBatch,
    file: StoredFile,
    settings: Settings,
    client: Client,
    store: Store,
    identity: Identity,
) -> Batch:
    """Create the batch of `req` over `file` (checked: the caller's, purpose `batch`) and start
    its workflow. Also how `/gateway/v1/batches` creates a job's one-line batch."""
    # One clock reading for both, so newest-first by (created_at, id) matches creation order.
    now_ms = int(time.time() * 1000)
    now = now_ms // 1000
    batch_id = new_batch_id(now_ms)
    tracing.annotate(batch_id=batch_id)
    limits = settings.workspace_limits(identity.workspace)
    # One read of the input: its lines (the queued-lines limit, when set, and the estimate at
    # submit) and its first line (the estimate's model).
    scan = await asyncio.to_thread(scan_input, store, file.id)
    lines = scan.lines
    reservation = ReserveRequest(
        batch_id=batch_id,
        input_file_id=file.id,
        input_bytes=file.bytes,
        lines=lines if limits.max_queued_lines is not None else 0,
        max_active_batches=limits.max_active_batches,
        max_queued_lines=limits.max_queued_lines,
    )
    await admission.reserve(client, settings, identity.workspace, reservation)
    try:
        await asyncio.to_thread(store.snapshot_input, batch_id, file.id)
    except BaseException:
        await admission.release(client, identity.workspace, batch_id)
        raise
    allowed = sorted(identity.allowed_models) if identity.allowed_models is not None else None
    estimate = await estimate_at_submit(
        client=client,
        settings=settings,
        history=history_of(settings.data_dir),
        first_line=scan.head,
        endpoint=req.endpoint,
        lines=lines,
        now=now,
        expires_at=now + COMPLETION_WINDOWS[req.completion_window] * 3600,
    )
    inp = BatchInput(
        batch_id=batch_id,
        workspace=identity.workspace,
        input_file_id=file.id,
        endpoint=req.endpoint,
        completion_window=req.completion_window,
        created_at=now,
        metadata=req.metadata,
        allowed_models=allowed,
        key_id=identity.key_id,
        role=identity.role,
        line_timeout_seconds=settings.limits.line_timeout_seconds,
        max_line_retries=settings.limits.max_line_retries,
        line_heartbeat_timeout_seconds=settings.limits.line_heartbeat_timeout_seconds,
        output_expires_after_seconds=(
            req.output_expires_after.seconds if req.output_expires_after else None
        ),
        estimate=estimate,
    )
    summary = batch_summary(req.endpoint, file.filename, identity.workspace)
    retry_of = await retry_link(client, identity, req.metadata)
    try:
        await _start(client, settings, inp, identity.workspace, summary, retry_of)
    except BaseException:
        # Nothing runs: the pinned copy of the input must not outlive the failed create.
        await asyncio.to_thread(store.drop_batch_work, batch_id)
        await admission.release(client, identity.workspace, batch_id)
        raise
    return initial_batch(inp)


SUMMARY_BYTES = 400
"""Temporal's default limit on a workflow's summary; a longer one fails `start_workflow`."""


def batch_summary(endpoint: str, filename: str, workspace: str) -> str:
    """`<endpoint> batch of <file> (<workspace>)`, within `SUMMARY_BYTES` of UTF-8: the file
    name (the user's, up to 256 characters of any script) is cut on a character boundary."""
    frame = f"{endpoint} batch of  ({workspace})"
    room = SUMMARY_BYTES - len(frame.encode())
    name = filename
    if len(name.encode()) > room:
        name = name.encode()[: max(0, room - 3)].decode(errors="ignore") + "…"
    return f"{endpoint} batch of {name} ({workspace})"


async def _start(
    client: Client,
    settings: Settings,
    inp: BatchInput,
    workspace: str,
    summary: str,
    retry_of: str | None = None,
) -> None:
    link = [SearchAttributePair(sa.RETRY_OF, retry_of)] if retry_of else []
    await client.start_workflow(
        BatchWorkflow.run,
        inp,
        id=inp.batch_id,
        task_queue=settings.task_queue,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(sa.WORKSPACE, workspace),
                SearchAttributePair(sa.STATUS, "validating"),
                SearchAttributePair(sa.ENDPOINT, inp.endpoint),
                SearchAttributePair(sa.CREATED_AT, inp.created_at),
                *link,
            ]
        ),
        memo={"workspace": workspace, SUMMARY_MEMO: summary, **job_memo(inp.metadata)},
        static_summary=summary,
    )


@router.get("", response_model=BatchList)
async def list_batches(
    client: ClientDep,
    identity: IdentityDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> BatchList:
    query = f"{sa.WORKSPACE.name} = '{sa.quote(identity.workspace)}'"
    return await list_page(client, query, after=after, limit=limit)


@router.get("/{batch_id}", response_model=Batch, responses=error_responses(404))
async def retrieve_batch(batch_id: str, client: ClientDep, identity: IdentityDep) -> Batch:
    desc = await describe_batch(client, identity, batch_id)
    batch = await load_batch(client, batch_id, desc)
    if batch.status not in TERMINAL_STATUSES and not batch.backfill.stale:
        await add_route_reasons(client, batch, desc)
    fill_eta(batch)
    if batch.status in TERMINAL_STATUSES:  # retried once ended: no extra query per poll before
        batch.backfill.retries = await retries_of(client, batch_id)
    return batch


@router.post("/{batch_id}/cancel", response_model=Batch, responses=error_responses(403, 404, 409))
async def cancel_batch(batch_id: str, client: ClientDep, identity: IdentityDep) -> Batch:
    identity.require_write()
    desc = await describe_batch(client, identity, batch_id)
    batch = await load_batch(client, batch_id, desc)
    if batch.status in TERMINAL_STATUSES:
        raise Conflict(
            f"Cannot cancel a batch with status '{batch.status}'.", code="invalid_batch_status"
        )
    audit.cross_workspace(identity, "batch.cancel", batch_id, workspace_of(desc))
    handle = client.get_workflow_handle_for(BatchWorkflow.run, batch_id)
    try:
        return await handle.execute_update(BatchWorkflow.cancel_now)
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        # The batch ended between the read above and the update ("workflow execution already
        # completed"): the same answer as a cancel of an ended batch.
        ended = await load_batch(client, batch_id, await describe_batch(client, identity, batch_id))
        raise Conflict(
            f"Cannot cancel a batch with status '{ended.status}'.", code="invalid_batch_status"
        ) from None
    except WorkflowUpdateFailedError as err:
        # The workflow refused (e.g. it ended or changed status meanwhile): say so, not 500.
        log.warning("cancel of %s refused by the workflow: %s", batch_id, err.cause)
        raise Conflict(
            f"The batch could not be cancelled now: {err.cause}", code="invalid_batch_status"
        ) from None


@router.post("/{batch_id}/pause", response_model=Batch, responses=error_responses(403, 404, 409))
async def pause_batch(batch_id: str, client: ClientDep, identity: IdentityDep) -> Batch:
    """Extension: hold the batch's lines back (running lines finish) until resumed."""
    return await _control(client, identity, batch_id, pause=True)


@router.post("/{batch_id}/resume", response_model=Batch, responses=error_responses(403, 404, 409))
async def resume_batch(batch_id: str, client: ClientDep, identity: IdentityDep) -> Batch:
    """Extension: let a paused batch's lines run again."""
    return await _control(client, identity, batch_id, pause=False)


async def _control(client: Client, identity: Identity, batch_id: str, *, pause: bool) -> Batch:
    identity.require_write()
    desc = await describe_batch(client, identity, batch_id)
    batch = await load_batch(client, batch_id, desc)
    if batch.status not in ("validating", "in_progress"):
        verb = "pause" if pause else "resume"
        raise Conflict(
            f"Cannot {verb} a batch with status '{batch.status}'.", code="invalid_batch_status"
        )
    audit.cross_workspace(
        identity, "batch.pause" if pause else "batch.resume", batch_id, workspace_of(desc)
    )
    handle = client.get_workflow_handle_for(BatchWorkflow.run, batch_id)
    if pause:
        await handle.signal(BatchWorkflow.pause, PauseRequest(by=identity.key_name))
    else:
        await handle.signal(BatchWorkflow.resume)
    # The signal is in history before we query, so a worker's answer includes it. Without a
    # worker (no answer just now: not asked again) the signal waits in history for one; the
    # stale answer shows it as requested.
    if not batch.backfill.stale:
        batch = await load_batch(client, batch_id)
    if batch.backfill.stale:
        batch.backfill.paused = pause
        batch.backfill.paused_by = identity.key_name if pause else None
    return batch


__all__ = ["router", "RPCStatusCode"]
