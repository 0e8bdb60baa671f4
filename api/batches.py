"""OpenAI Batches API (+ pause/resume extensions) over BatchWorkflow."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, get_args

from fastapi import APIRouter, Query
from pydantic import ValidationError
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowUpdateFailedError,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from api import admission, audit
from api.deps import ClientDep, Identity, IdentityDep, SettingsDep, StoreDep, WriterDep
from api.errors import Conflict, InvalidRequest, NotFound
from api.eta import fill_eta
from api.history_view import QUICK_QUERY, quick_query, started_input
from api.retries import retries_of, retry_link
from api.schemas import COMMON_ERRORS, BatchList, CreateBatch, error_responses
from backfill import search_attributes as sa
from backfill import tracing
from backfill.admission import ReserveRequest
from backfill.batches import TERMINAL_STATUSES, Batch, BatchStatus
from backfill.config import Settings
from backfill.ids import new_batch_id
from backfill.jobs import job_memo
from backfill.lifecycle import STATUS_MEMO, STATUS_MEMO_FIELDS, SUMMARY_MEMO, initial_batch
from backfill.messages import BatchInput, PauseRequest
from backfill.progress import add_route_reasons
from backfill.refs import BatchWorkflow
from backfill.store import FileObject as StoredFile
from backfill.store import Store, chunks

router = APIRouter(prefix="/v1/batches", tags=["batches"], responses=COMMON_ERRORS)
log = logging.getLogger(__name__)


def _count_lines(store: Store, file_id: str) -> int:
    """Lines of an uploaded file (a last line without its newline counts), read in chunks."""
    lines, last = 0, b"\n"
    for chunk in chunks(store.open_file(file_id)):
        lines += chunk.count(b"\n")
        last = chunk[-1:]
    return lines + (last != b"\n")


@router.post("", response_model=Batch, responses=error_responses(403, 404, 429))
async def create_batch(
    req: CreateBatch,
    settings: SettingsDep,
    client: ClientDep,
    store: StoreDep,
    identity: WriterDep,
) -> Batch:
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
    lines = 0
    if limits.max_queued_lines is not None:
        lines = await asyncio.to_thread(_count_lines, store, file.id)
    reservation = ReserveRequest(
        batch_id=batch_id,
        input_file_id=file.id,
        input_bytes=file.bytes,
        lines=lines,
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


LIST_FIRST_WINDOW_SECONDS = 3600
"""A listing reads batches by windows of creation time, newest first, starting with this one."""


def list_window_rows(limit: int) -> int:
    """Most rows one window of a listing reads: a window counted above this is halved first
    (down to one second), so a page reads a few times `limit` rows, not every batch kept."""
    return 4 * (limit + 1)


async def list_page(
    client: Client,
    filters: str,
    *,
    after: str | None,
    limit: int,
    keep: Callable[[WorkflowExecution], Awaitable[bool]] | None = None,
) -> BatchList:
    """One page of the batches matching `filters` (a visibility query, or ""), and `keep` if
    given, newest first with a stable `after` cursor. Shared by `/v1/batches`, the admin
    listing and `/gateway/v1/batches`.

    SQL visibility ignores ORDER BY, so the order is made here, by (created_at, id), from
    windows of `BackfillCreatedAt` read newest first: each window is counted before it is
    read and halved while it holds more than `list_window_rows`, and the next, older window
    is read only while the page is not full. A request reads about the page, not every batch
    the workspace keeps."""
    base = "WorkflowType = 'BatchWorkflow'" + (f" AND {filters}" if filters else "")
    below: tuple[int, str] | None = None
    if after is not None:
        found = await _rows(client, f"{base} AND WorkflowId = '{sa.quote(after)}'", keep)
        if not found:
            raise InvalidRequest(f"No such batch for 'after': {after}", param="after")
        below = found[0]
    rows: list[tuple[int, str]] = []
    width = LIST_FIRST_WINDOW_SECONDS
    hi = below[0] if below is not None else None
    while True:
        lo = (hi if hi is not None else int(time.time())) - width + 1
        window = f"{base} AND {sa.CREATED_AT.name} >= {lo}"
        if hi is not None:
            window += f" AND {sa.CREATED_AT.name} <= {hi}"
        counted = (await client.count_workflows(window)).count
        if counted > list_window_rows(limit) and width > 1:
            width //= 2
            continue
        got = await _rows(client, window, keep)
        rows += sorted((r for r in got if below is None or r < below), reverse=True)
        if len(rows) > limit:
            break
        older = f"{base} AND {sa.CREATED_AT.name} < {lo}"
        if (await client.count_workflows(older)).count == 0:
            break
        hi = lo - 1
        if counted < limit:
            width *= 4
    page = rows[:limit]
    statuses: dict[str, asyncio.Task[Any]] = {}
    batches = await asyncio.gather(
        *(_load_or_stub(client, batch_id, statuses) for _, batch_id in page)
    )
    return BatchList(
        data=batches,
        first_id=batches[0].id if batches else None,
        last_id=batches[-1].id if batches else None,
        has_more=len(rows) > limit,
    )


async def _rows(
    client: Client, query: str, keep: Callable[[WorkflowExecution], Awaitable[bool]] | None
) -> list[tuple[int, str]]:
    """(created_at, id) of each batch the query finds (its current run only), kept by `keep`."""
    rows: dict[str, tuple[int, str]] = {}
    async for ex in client.list_workflows(query, page_size=1000):
        if ex.status == WorkflowExecutionStatus.CONTINUED_AS_NEW:
            continue
        if keep is not None and not await keep(ex):
            continue
        created = ex.typed_search_attributes.get(sa.CREATED_AT) or 0
        rows[ex.id] = (int(created), ex.id)
    return list(rows.values())


@router.get("/{batch_id}", response_model=Batch, responses=error_responses(404))
async def retrieve_batch(batch_id: str, client: ClientDep, identity: IdentityDep) -> Batch:
    desc = await _describe(client, identity, batch_id)
    batch = await _load(client, batch_id, desc)
    if batch.status not in TERMINAL_STATUSES and not batch.backfill.stale:
        await add_route_reasons(client, batch, desc)
    fill_eta(batch)
    if batch.status in TERMINAL_STATUSES:  # retried once ended: no extra query per poll before
        batch.backfill.retries = await retries_of(client, batch_id)
    return batch


@router.post("/{batch_id}/cancel", response_model=Batch, responses=error_responses(403, 404, 409))
async def cancel_batch(batch_id: str, client: ClientDep, identity: IdentityDep) -> Batch:
    identity.require_write()
    desc = await _describe(client, identity, batch_id)
    batch = await _load(client, batch_id, desc)
    if batch.status in TERMINAL_STATUSES:
        raise Conflict(
            f"Cannot cancel a batch with status '{batch.status}'.", code="invalid_batch_status"
        )
    audit.cross_workspace(identity, "batch.cancel", batch_id, _workspace(desc))
    handle = client.get_workflow_handle_for(BatchWorkflow.run, batch_id)
    try:
        return await handle.execute_update(BatchWorkflow.cancel_now)
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        # The batch ended between the read above and the update ("workflow execution already
        # completed"): the same answer as a cancel of an ended batch.
        ended = await _load(client, batch_id, await _describe(client, identity, batch_id))
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
    desc = await _describe(client, identity, batch_id)
    batch = await _load(client, batch_id, desc)
    if batch.status not in ("validating", "in_progress"):
        verb = "pause" if pause else "resume"
        raise Conflict(
            f"Cannot {verb} a batch with status '{batch.status}'.", code="invalid_batch_status"
        )
    audit.cross_workspace(
        identity, "batch.pause" if pause else "batch.resume", batch_id, _workspace(desc)
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
        batch = await _load(client, batch_id)
    if batch.backfill.stale:
        batch.backfill.paused = pause
        batch.backfill.paused_by = identity.key_name if pause else None
    return batch


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
    """The Batch object: the result of a completed workflow, else the workflow's own query,
    else (no worker answers within `QUICK_QUERY`) Temporal's record of it, marked stale."""
    handle = client.get_workflow_handle_for(BatchWorkflow.run, batch_id)
    if desc is None:
        desc = await handle.describe()
    if desc.status == WorkflowExecutionStatus.COMPLETED:
        return await handle.result()
    try:
        batch = await quick_query(handle, BatchWorkflow.describe)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise
        log.warning("batch %s from Temporal's record (query unanswered: %s)", batch_id, err)
        batch = await _recorded(client, desc)
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


async def _recorded(client: Client, desc: WorkflowExecutionDescription) -> Batch:
    """The batch as Temporal records it without a worker: the current run's input (the batch
    as created, or as carried across its last continue-as-new), overlaid with the compact status
    the workflow wrote to its memo at its last status change (status, counts, times), else the
    status in its search attribute (runs started before the memo was written)."""
    inp = await started_input(client, desc.id, BatchInput)
    batch = inp.state.batch.model_copy(deep=True) if inp.state else initial_batch(inp)
    memo = await desc.memo_value(STATUS_MEMO, None)
    if isinstance(memo, dict):
        known = {k: v for k, v in memo.items() if k in STATUS_MEMO_FIELDS}
        try:
            batch = Batch.model_validate({**batch.model_dump(), **known})
        except ValidationError as err:
            log.warning("batch %s: unreadable status memo: %s", desc.id, err)
    status = desc.typed_search_attributes.get(sa.STATUS)
    if not isinstance(memo, dict) and status in get_args(BatchStatus):
        batch.status = status  # type: ignore[assignment]
    batch.backfill.stale = True
    batch.backfill.summary = "Status as last recorded: no worker is answering for this batch"
    return batch


async def _load_or_stub(
    client: Client, batch_id: str, statuses: dict[str, asyncio.Task[Any]]
) -> Batch:
    """For listings: each batch as `GET /v1/batches/{id}` shows it (with why its lines wait).
    One batch that cannot be read right now must not fail the whole page; it is listed from
    its search attributes instead."""
    try:
        desc = await client.get_workflow_handle(batch_id).describe()
        batch = await _load(client, batch_id, desc)
        if batch.status not in TERMINAL_STATUSES and not batch.backfill.stale:
            # Bounded: a busy scheduler leaves the reason out of a listing, never slows it.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(QUICK_QUERY.total_seconds()):
                    await add_route_reasons(client, batch, desc, statuses)
        return batch
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


def _workspace(desc: WorkflowExecutionDescription) -> str:
    return desc.typed_search_attributes.get(sa.WORKSPACE) or ""


__all__ = ["router", "RPCStatusCode"]
