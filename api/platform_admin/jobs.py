"""The administrators' jobs API: `/gateway/ui-api/batches` over every workspace's single jobs.

The same jobs as `/gateway/v1/batches` (each a one-line batch, `backfill.batches.jobs`), read and
controlled through that router's own functions (`api.jobs.jobs_api`), so states, 404s, 409s, the
audit log and the content rule are the same. What is added: every workspace, filters (workspace,
state, model), and each job's workspace and identity snapshot (the creating key's id, role and
models when the job was created; never the key).

Roles: a platform admin reads and controls every job; an auditor reads (a control answers 403
`read_only`; the output, being content, 403 `insufficient_role`); a member gets 403
`insufficient_role` everywhere (its own jobs are `/gateway/v1/batches`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, get_args

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response
from temporalio.client import Client, WorkflowExecution
from temporalio.service import RPCError

from api.batches import batches_api as batches
from api.batches import reads as batch_reads
from api.batches.history_view import started_input
from api.deps import BuffersDep, ClientDep, Identity, SettingsDep, StoreDep
from api.errors import InvalidRequest
from api.jobs import jobs_api as jobs
from api.platform_admin.batches import AdminReaderDep, batch_filters
from api.schemas import COMMON_ERRORS, AdminJob, AdminJobList, JobIdentity, error_responses
from backfill.batches import search_attributes as sa
from backfill.batches.batch import Batch
from backfill.batches.jobs import BATCH_STATUSES, JOB_MEMO, JobState, job_state, settled_state
from backfill.batches.lifecycle import STATUS_MEMO
from backfill.files import Store
from backfill.platform.messages import BatchInput

PREFIX = "/gateway/ui-api/batches"
router = APIRouter(prefix=PREFIX, tags=["admin"], responses=COMMON_ERRORS | error_responses(403))
log = logging.getLogger(__name__)


def job_filters(workspace: str | None, state: str | None, model: str | None) -> str:
    """The visibility query narrowing a listing to these filters: the workspace, the model, and
    the batch statuses a job in `state` can have (400 `param: state` for an unknown state)."""
    query = batch_filters(workspace, None, model)
    if state is None:
        return query
    if state not in get_args(JobState):
        raise InvalidRequest(f"Unknown job state {state!r}.", param="state")
    statuses = ", ".join(f"'{s}'" for s in BATCH_STATUSES[state])  # type: ignore[index]
    return " AND ".join(q for q in (query, f"{sa.STATUS.name} IN ({statuses})") if q)


def keep_jobs(
    client: Client, identity: Identity, state: str | None
) -> Callable[[WorkflowExecution], Awaitable[bool]]:
    """The listing's `keep`: jobs only, and in `state` when given. An ended (or cancelling)
    batch's state comes from its status memo; a running one's needs its batch (a query)."""

    async def keep(ex: WorkflowExecution) -> bool:
        if not await ex.memo_value(JOB_MEMO, False):
            return False
        if state is None:
            return True
        memo = await ex.memo_value(STATUS_MEMO, None)
        if isinstance(memo, dict):
            counts = memo.get("request_counts") or {}
            settled = settled_state(memo.get("status"), int(counts.get("completed") or 0))  # type: ignore[arg-type]
            if settled is not None:
                return settled == state
        try:
            batch = await batches.retrieve_batch(ex.id, client, identity)
        except Exception as err:  # a batch unreadable now is left out of a filtered page
            log.warning("job %s left out of a listing by state: %s", ex.id, err)
            return False
        return job_state(batch) == state

    return keep


async def identity_of(client: Client, batch: Batch) -> JobIdentity:
    """The batch's identity snapshot, from the input its workflow's current run started with;
    the workspace alone when that cannot be read."""
    workspace = batch.backfill.workspace or ""
    try:
        inp = await started_input(client, batch.id, BatchInput)
    except (RPCError, LookupError) as err:
        log.warning("job %s: identity snapshot unreadable: %s", batch.id, err)
        return JobIdentity(workspace=workspace)
    return JobIdentity(
        workspace=inp.workspace, key_id=inp.key_id, role=inp.role, allowed_models=inp.allowed_models
    )


async def admin_view(client: Client, store: Store, batch: Batch) -> AdminJob:
    job, who = await asyncio.gather(jobs.view(store, batch), identity_of(client, batch))
    return AdminJob(**job.model_dump(), workspace=who.workspace, identity=who)


@router.get("", response_model=AdminJobList)
async def list_all_jobs(
    client: ClientDep,
    store: StoreDep,
    identity: AdminReaderDep,
    workspace: str | None = None,
    state: str | None = None,
    model: str | None = None,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> AdminJobList:
    """Every workspace's jobs, newest first, filtered by workspace, state (`queued`, `running`,
    `pausing`, `paused`, `cancelling`, `cancelled`, `completed`, `failed`) and model
    (`after`: the last id of the previous page)."""
    return await job_page(client, store, identity, workspace, state, model, after, limit)


async def job_page(
    client: Client,
    store: Store,
    identity: Identity,
    workspace: str | None,
    state: str | None,
    model: str | None,
    after: str | None,
    limit: int,
) -> AdminJobList:
    """One page of jobs matching the filters, newest first: this listing's, and the console's
    (which pins a member to its workspace)."""
    filters = job_filters(workspace, state, model)
    keep = keep_jobs(client, identity, state)
    page = await batch_reads.list_page(client, filters, after=after, limit=limit, keep=keep)
    data = await asyncio.gather(*(admin_view(client, store, b) for b in page.data))
    return AdminJobList.of(list(data), has_more=page.has_more, last_id=page.last_id)


@router.get("/{job_id}", response_model=AdminJob, responses=error_responses(404))
async def retrieve_any_job(
    job_id: str, client: ClientDep, store: StoreDep, identity: AdminReaderDep
) -> AdminJob:
    """One job of any workspace; 404 `job_not_found` for an id that is not a job."""
    return await admin_view(client, store, await jobs.job_batch(client, identity, job_id))


@router.get(
    "/{job_id}/output",
    response_class=JSONResponse,
    responses=jobs.output_responses(404, 409),
)
async def any_job_output(
    job_id: str,
    client: ClientDep,
    store: StoreDep,
    identity: AdminReaderDep,
    settings: SettingsDep,
    buffers: BuffersDep,
) -> Response:
    """As `GET /gateway/v1/batches/{id}/output`, for a job of any workspace (platform admins;
    auditors never read content)."""
    return await jobs.output(job_id, client, store, identity, settings, buffers)


async def _control(
    action: str, job_id: str, client: Client, store: Store, identity: Identity
) -> AdminJob:
    return await admin_view(
        client, store, await jobs.control_batch(action, job_id, client, identity)
    )


@router.post("/{job_id}/pause", response_model=AdminJob, responses=error_responses(404, 409))
async def pause_any_job(
    job_id: str, client: ClientDep, store: StoreDep, identity: AdminReaderDep
) -> AdminJob:
    """Hold the job back (`pausing` while an attempt is in flight, then `paused`)."""
    return await _control("pause", job_id, client, store, identity)


@router.post("/{job_id}/resume", response_model=AdminJob, responses=error_responses(404, 409))
async def resume_any_job(
    job_id: str, client: ClientDep, store: StoreDep, identity: AdminReaderDep
) -> AdminJob:
    """Let a paused job run again (`queued`)."""
    return await _control("resume", job_id, client, store, identity)


@router.post("/{job_id}/cancel", response_model=AdminJob, responses=error_responses(404, 409))
async def cancel_any_job(
    job_id: str, client: ClientDep, store: StoreDep, identity: AdminReaderDep
) -> AdminJob:
    """Cancel the job (`cancelling`, then `cancelled`); an attempt in flight finishes."""
    return await _control("cancel", job_id, client, store, identity)
