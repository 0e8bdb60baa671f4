"""Where a batch's state is read from, for every api route that shows batches: the workflow's
query, its result once completed, Temporal's record of it when no worker answers (marked stale),
and the listings' pages (by windows of creation time). No routes here: `api/batches/batches_api.py`
has the OpenAI routes, `api/batches/results.py`, `api/jobs/jobs_api.py` and the admin listings read
through this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, get_args

from pydantic import ValidationError
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
)
from temporalio.service import RPCError, RPCStatusCode

from api.batches.history_view import QUICK_QUERY, quick_query, started_input
from api.deps import Identity
from api.errors import InvalidRequest, NotFound, unregistered_search_attribute
from api.listing_params import check_after
from api.schemas import BatchList
from backfill.batches import search_attributes as sa
from backfill.batches.batch import TERMINAL_STATUSES, Batch, BatchStatus
from backfill.batches.lifecycle import STATUS_MEMO, STATUS_MEMO_FIELDS, initial_batch
from backfill.batches.progress import add_route_reasons
from backfill.batches.storage_waits import waits_on_store
from backfill.platform.messages import BatchInput
from backfill.platform.refs import BatchWorkflow

log = logging.getLogger(__name__)


LIST_FIRST_WINDOW_SECONDS = 3600
"""A listing reads batches by windows of creation time, newest first, starting with this one."""


def list_window_rows(limit: int) -> int:
    """Most rows one window of a listing reads: a window counted above this is halved first
    (down to one second), so a page reads a few times `limit` rows, not every batch kept."""
    return 4 * (limit + 1)


SCAN_ROWS = 1000
"""Most batches one page of a listing with `keep` (the job listings: the query cannot tell a
job from a batch) examines once it has read a window: past it the page ends early, with
`has_more` and the last batch examined as its `last_id`, so a workspace with a long history
and few jobs costs each request about this many rows, never its whole history."""


async def list_page(
    client: Client,
    filters: str,
    *,
    after: str | None,
    limit: int,
    keep: Callable[[WorkflowExecution], Awaitable[bool]] | None = None,
) -> BatchList:
    """One page of the batches matching `filters` (a visibility query, or ""), and `keep` if
    given, newest first with a stable `after` cursor (a batch id: `api.cursors`; with `keep`,
    any batch the filters match, so a page that `SCAN_ROWS` ended early continues). Shared by
    `/v1/batches`, the admin listing, the job listings and the console.

    SQL visibility ignores ORDER BY, so the order is made here, by (created_at, id), from
    windows of `BackfillCreatedAt` read newest first: each window is counted before it is
    read and halved while it holds more than `list_window_rows`, and the next, older window
    is read only while the page is not full. A request reads about the page, not every batch
    the workspace keeps. A Temporal refusal of the query (the filters come from the request)
    is a 400, never the 503 of an outage."""
    check_after(after, "batch")
    base = "WorkflowType = 'BatchWorkflow'" + (f" AND {filters}" if filters else "")
    below: tuple[int, str] | None = None
    if after is not None:
        found = await _rows(client, f"{base} AND WorkflowId = '{sa.quote(after)}'", None)
        if not found:
            raise InvalidRequest(f"No such batch for 'after': {after}", param="after")
        below = found[0][:2]
    rows: list[tuple[int, str]] = []
    scanned: list[tuple[int, str]] = []
    width = LIST_FIRST_WINDOW_SECONDS
    hi = below[0] if below is not None else None
    ended_early = False
    while True:
        lo = (hi if hi is not None else int(time.time())) - width + 1
        window = f"{base} AND {sa.CREATED_AT.name} >= {lo}"
        if hi is not None:
            window += f" AND {sa.CREATED_AT.name} <= {hi}"
        counted = await _count(client, window)
        if counted > list_window_rows(limit) and width > 1:
            width //= 2
            continue
        got = sorted(
            (r for r in await _rows(client, window, keep) if below is None or r[:2] < below),
            reverse=True,
        )
        rows += [r[:2] for r in got if r[2]]
        scanned += [r[:2] for r in got]
        if len(rows) > limit:
            break
        older = f"{base} AND {sa.CREATED_AT.name} < {lo}"
        if await _count(client, older) == 0:
            break
        if keep is not None and len(scanned) >= SCAN_ROWS:
            ended_early = True
            break
        hi = lo - 1
        if counted < limit:
            width *= 4
    page = rows[:limit]
    statuses: dict[str, asyncio.Task[Any]] = {}
    batches = await asyncio.gather(
        *(load_or_stub(client, batch_id, statuses) for _, batch_id in page)
    )
    if ended_early:
        return BatchList.of(batches, has_more=True, last_id=min(scanned)[1])
    return BatchList.of(batches, has_more=len(rows) > limit)


async def _count(client: Client, query: str) -> int:
    """How many workflows the query finds (`_refused` as a 400)."""
    try:
        return (await client.count_workflows(query)).count
    except RPCError as err:
        raise _refused(err) from None


def _refused(err: RPCError) -> Exception:
    """A visibility query's error: Temporal's refusal of the query (INVALID_ARGUMENT, not an
    unregistered search attribute) is a 400; anything else is raised as it is (an outage
    answers 503 `temporal_unavailable`, `api.errors`)."""
    if err.status == RPCStatusCode.INVALID_ARGUMENT and unregistered_search_attribute(err) is None:
        log.info("visibility query refused: %s", err)
        return InvalidRequest("The listing's filters cannot be queried; check their values.")
    return err


async def _rows(
    client: Client, query: str, keep: Callable[[WorkflowExecution], Awaitable[bool]] | None
) -> list[tuple[int, str, bool]]:
    """(created_at, id, kept by `keep`) of each batch the query finds (its current run only)."""
    rows: dict[str, tuple[int, str, bool]] = {}
    try:
        async for ex in client.list_workflows(query, page_size=1000):
            if ex.status == WorkflowExecutionStatus.CONTINUED_AS_NEW:
                continue
            kept = keep is None or await keep(ex)
            created = ex.typed_search_attributes.get(sa.CREATED_AT) or 0
            rows[ex.id] = (int(created), ex.id, kept)
    except RPCError as err:
        raise _refused(err) from None
    return list(rows.values())


async def describe_batch(
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


async def load_batch(
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
        batch = await recorded_batch(client, desc)
    if desc.status in (WorkflowExecutionStatus.TERMINATED, WorkflowExecutionStatus.CANCELED):
        # Stopped from outside (Temporal UI / CLI): no files were assembled.
        if batch.status not in TERMINAL_STATUSES:
            batch.status = "cancelled"
            batch.cancelled_at = int(desc.close_time.timestamp()) if desc.close_time else None
    elif desc.status in (WorkflowExecutionStatus.FAILED, WorkflowExecutionStatus.TIMED_OUT):
        if batch.status not in TERMINAL_STATUSES:
            batch.status = "failed"
            batch.failed_at = int(desc.close_time.timestamp()) if desc.close_time else None
    elif desc.status == WorkflowExecutionStatus.RUNNING:
        pending = [
            (p.activity_type.name, p.last_failure.application_failure_info.type)
            for p in desc.raw_description.pending_activities
        ]
        batch.backfill.waiting_on_store = waits_on_store(pending)
    return batch


async def recorded_batch(client: Client, desc: WorkflowExecutionDescription) -> Batch:
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


async def load_or_stub(
    client: Client, batch_id: str, statuses: dict[str, asyncio.Task[Any]]
) -> Batch:
    """For listings: each batch as `GET /v1/batches/{id}` shows it (with why its lines wait).
    One batch that cannot be read right now must not fail the whole page; it is listed from
    its search attributes instead."""
    try:
        desc = await client.get_workflow_handle(batch_id).describe()
        batch = await load_batch(client, batch_id, desc)
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


def workspace_of(desc: WorkflowExecutionDescription) -> str:
    return desc.typed_search_attributes.get(sa.WORKSPACE) or ""
