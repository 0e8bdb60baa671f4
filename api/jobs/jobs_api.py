"""Single durable jobs: `/gateway/v1/batches` (create, list, read, output, pause, resume,
cancel), each job a one-line batch underneath.

Creating a job stores its one line as an input file of the caller's workspace (as an upload is
stored) and starts the batch exactly as `POST /v1/batches` does
(`api.batches.batches_api.start_batch`), with `backfill.batches.jobs.JOB_METADATA` in its metadata.
Reads and controls go through the Batches API's own functions, so visibility, roles and audit are
the same; the job view is `backfill.batches.jobs.job_of`.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse
from temporalio.client import Client, WorkflowExecution

from api.batches import batches_api as batches
from api.batches import reads as batch_reads
from api.buffers import HeldResponse
from api.buffers import busy as buffers_busy
from api.deps import (
    BuffersDep,
    ClientDep,
    Identity,
    IdentityDep,
    SettingsDep,
    StoreDep,
    WriterDep,
)
from api.errors import Conflict, InvalidRequest, NotFound, TooManyRequests
from api.files.files_api import storage_room
from api.platform_admin import audit
from api.schemas import COMMON_ERRORS, CreateBatch, CreateJob, JobList, error_responses
from api.tenancy import admission
from api.tenancy.admission import Pinned
from backfill.batches import search_attributes as sa
from backfill.batches.batch import TERMINAL_STATUSES, Batch, BatchError
from backfill.batches.input_rules import validate_input
from backfill.batches.jobs import (
    JOB_MEMO,
    JOB_METADATA,
    RECORD_HEAD_BYTES,
    Job,
    JobState,
    is_job,
    job_line,
    job_of,
    job_state,
    read_record,
    read_record_head,
)
from backfill.files import FileObject as StoredFile
from backfill.files import Store
from backfill.platform.config import Settings
from backfill.tenancy.byte_budget import ByteBudget, Claim

PREFIX = "/gateway/v1/batches"
router = APIRouter(prefix=PREFIX, tags=["jobs"], responses=COMMON_ERRORS)

JOB_FILENAME = "gateway-job.jsonl"
"""The name of a job's stored input file (one line)."""
_UNCONTROLLABLE: frozenset[JobState] = frozenset({"completed", "failed", "cancelled"})
OUTPUT_COPIES = 3
"""What a job's output holds while it is served, in its record's size: the record read, the
answer decoded from it, and the answer encoded to be sent."""
_PAUSABLE = ("validating", "in_progress")
"""The batch statuses a job may be paused or resumed in (as for any batch)."""


# ---- create ----------------------------------------------------------------------------------
@router.post(
    "",
    status_code=202,
    response_model=Job,
    responses={
        202: {
            "description": "Accepted: the job is queued",
            "headers": {
                "Location": {
                    "description": "The job's URL (`/gateway/v1/batches/{id}`)",
                    "schema": {"type": "string"},
                }
            },
        },
        **error_responses(403, 429),
    },
)
async def create_job(
    req: CreateJob,
    response: Response,
    settings: SettingsDep,
    client: ClientDep,
    store: StoreDep,
    identity: WriterDep,
) -> Job:
    """Queue one request; it runs in the route's spare capacity like a batch line."""
    metadata = dict(req.metadata or {})
    batches.refuse_reserved_metadata(metadata)
    line = job_line(req.path, req.body)
    _check_line(line, req.path, settings, identity)
    workspace = identity.workspace
    limit = settings.workspace_limits(workspace).max_stored_bytes
    pins = await admission.pinned(client, settings, workspace) if limit is not None else None
    file = await asyncio.to_thread(_store_line, settings, store, workspace, line, pins)
    create = CreateBatch(
        input_file_id=file.id,
        endpoint=req.path,
        completion_window=req.completion_window,
        metadata={**metadata, **JOB_METADATA},
    )
    try:
        batch = await batches.start_batch(create, file, settings, client, store, identity)
    except BaseException:
        await asyncio.to_thread(store.delete_file, file.id)
        raise
    response.headers["Location"] = f"{PREFIX}/{batch.id}"
    job = job_of(batch, None)
    if job.model is None and isinstance(req.body.get("model"), str):
        job.model = req.body["model"]  # checked above; the batch learns it at validation
    return job


def _check_line(line: bytes, path: str, settings: Settings, identity: Identity) -> None:
    """The batch validator's checks on the job's line, now: a bad body is a 400 naming the
    field (`body.model`, `body.messages`, ...), never a job that fails later."""
    outcome = validate_input(
        io.BytesIO(line),
        batch_id="job",
        endpoint=path,
        settings=settings,
        allowed_models=identity.allowed_models,
        max_errors=1,
    )
    if outcome.errors:
        raise _invalid(outcome.errors[0])


def _invalid(error: BatchError) -> InvalidRequest:
    param = {None: "body", "url": "path"}.get(error.param, error.param)
    return InvalidRequest(error.message, param=param, code=error.code)


def _store_line(
    settings: Settings, store: Store, workspace: str, line: bytes, pins: Pinned | None
) -> StoredFile:
    """Store the job's line as an input file of the workspace (as `POST /v1/files` would):
    `pins`, the workspace's pinned inputs (`api.tenancy.admission.pinned`), count."""
    room = storage_room(settings, store, workspace, pins)
    if room is not None and len(line) > room:
        if pins is not None and pins.unanswered is not None and pins.bound > 0:
            raise pins.unanswered
        raise TooManyRequests(
            f"Workspace {workspace!r} has {room} bytes of file storage left; this job's "
            f"request needs {len(line)}. Delete files (or let them expire) first.",
            code="storage_limit_exceeded",
        )
    upload = store.begin_upload(max(settings.limits.max_file_bytes, len(line)))
    try:
        upload.write(line)
        return upload.finish(
            workspace=workspace,
            filename=JOB_FILENAME,
            purpose="batch",
            now=int(time.time()),
            expires_after=settings.limits.input_file_expiry_seconds,
        )
    finally:
        upload.abort()


# ---- read ------------------------------------------------------------------------------------
async def is_job_execution(ex: WorkflowExecution) -> bool:
    return bool(await ex.memo_value(JOB_MEMO, False))


@router.get("", response_model=JobList)
async def list_jobs(
    client: ClientDep,
    store: StoreDep,
    identity: IdentityDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> JobList:
    """The caller's workspace's jobs, newest first (`after`: the last id of the previous page)."""
    query = f"{sa.WORKSPACE.name} = '{sa.quote(identity.workspace)}'"
    page = await batch_reads.list_page(
        client, query, after=after, limit=limit, keep=is_job_execution
    )
    jobs = await asyncio.gather(*(view(store, b) for b in page.data))
    return JobList.of(list(jobs), has_more=page.has_more, last_id=page.last_id)


@router.get("/{job_id}", response_model=Job, responses=error_responses(404))
async def retrieve_job(
    job_id: str, client: ClientDep, store: StoreDep, identity: IdentityDep
) -> Job:
    return await view(store, await job_batch(client, identity, job_id))


def output_responses(*errors: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI answers of a job's output route (this one and the admin endpoints')."""
    answer = {
        "description": "The backend's answer body (JSON), once the job is completed",
        "content": {"application/json": {"schema": {}}},
    }
    return {200: answer, **error_responses(*errors)}


@router.get(
    "/{job_id}/output",
    response_class=JSONResponse,
    responses=output_responses(403, 404, 409),
)
async def job_output(
    job_id: str,
    client: ClientDep,
    store: StoreDep,
    identity: IdentityDep,
    settings: SettingsDep,
    buffers: BuffersDep,
) -> Response:
    return await output(job_id, client, store, identity, settings, buffers)


async def output(
    job_id: str,
    client: Client,
    store: Store,
    identity: Identity,
    settings: Settings,
    buffers: ByteBudget,
) -> Response:
    """The completed job's answer body, for this caller (shared with the admin endpoints).
    Its record is read up to the largest a line's can be (`limits.max_response_bytes` and the
    record's own fields); one longer is not a job's, and is not read on. What it holds is
    claimed from the process's `buffers` first, in the job's workspace's share (`api.buffers`:
    503 `gateway_busy` when it does not fit) and given back once the answer is sent."""
    identity.require_content()
    batch = await job_batch(client, identity, job_id)
    most = settings.limits.max_response_bytes + RECORD_HEAD_BYTES
    claim = buffers.claim(batch.backfill.workspace or identity.workspace)
    try:
        return await _output(job_id, identity, store, batch, claim, most)
    except BaseException:
        claim.release()
        raise


async def _output(
    job_id: str, identity: Identity, store: Store, batch: Batch, claim: Claim, most: int
) -> Response:
    data = await asyncio.to_thread(_output_record, store, batch, claim, most + 1)
    if data is not None and (end := data.find(b"\n")) >= 0:
        data = data[:end]  # the first line: a job's output file holds one
    record = read_record(data) if data is not None and len(data) <= most else None
    job = job_of(batch, record)
    if job.state == "failed":
        why = f" ({job.error.code}: {job.error.message})" if job.error else ""
        raise Conflict(f"Job {job_id} failed{why}; it has no output.", code="job_failed")
    if job.state != "completed":
        raise Conflict(
            f"Job {job_id} is {job.state}; its output is available once it is completed.",
            code="job_not_completed",
        )
    if record is None or record.status_code is None:
        raise NotFound(
            f"The output of job {job_id} is no longer stored (its batch's output file was "
            "deleted or expired).",
            code="output_not_found",
        )
    audit.cross_workspace(identity, "job.output", job_id, batch.backfill.workspace or "")
    body = json.dumps(record.body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return HeldResponse(body.encode(), claim)


async def job_batch(client: Client, identity: Identity, job_id: str) -> Batch:
    """The job's batch; 404 for a batch that is not a job, or one the caller may not see."""
    not_found = NotFound(f"No such job: {job_id}", param="job_id", code="job_not_found")
    try:
        batch = await batches.retrieve_batch(job_id, client, identity)
    except NotFound:
        raise not_found from None
    if not is_job(batch.metadata):
        raise not_found
    return batch


async def view(store: Store, batch: Batch) -> Job:
    """The job view of `batch`: at most `RECORD_HEAD_BYTES` of its record are read, whatever
    the size of its answer (or of the output file of a batch that only says it is a job)."""
    head = await asyncio.to_thread(_record, store, batch, RECORD_HEAD_BYTES + 1)
    cut = head is not None and len(head) > RECORD_HEAD_BYTES
    return job_of(batch, read_record_head(head, cut=cut) if head is not None else None)


def _record(store: Store, batch: Batch, max_bytes: int) -> bytes | None:
    """At most `max_bytes` of the job's line's committed record: in the store while the batch
    runs, in its output or error file (one line) once it ended. None when there is none (yet,
    or any more)."""
    if batch.status in TERMINAL_STATUSES:
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id:
                try:
                    return store.read_file_head(file_id, max_bytes)
                except FileNotFoundError:
                    continue
        return None
    try:
        return store.get_result_head(batch.id, 0, max_bytes)
    except (FileNotFoundError, KeyError):
        return None


def _output_record(store: Store, batch: Batch, claim: Claim, max_bytes: int) -> bytes | None:
    """At most `max_bytes` of the ended job's output (or error) file, `OUTPUT_COPIES` times
    its size claimed before it is read (503 `gateway_busy` when that does not fit)."""
    for file_id in (batch.output_file_id, batch.error_file_id):
        obj = store.get_file(file_id) if file_id else None
        if obj is None:
            continue
        size = min(obj.bytes, max_bytes)
        if not claim.resize(OUTPUT_COPIES * size):
            raise buffers_busy()
        try:
            return store.read_file_head(obj.id, size)
        except FileNotFoundError:
            continue
    return None


# ---- control ---------------------------------------------------------------------------------
async def control(
    action: str, job_id: str, client: Client, store: Store, identity: Identity
) -> Job:
    return await view(store, await control_batch(action, job_id, client, identity))


async def control_batch(action: str, job_id: str, client: Client, identity: Identity) -> Batch:
    """Pause, resume or cancel the job (409 `invalid_job_state` when its state does not
    allow it); its batch as the control left it. Shared with the admin endpoints."""
    identity.require_write()
    batch = await job_batch(client, identity, job_id)
    state = job_state(batch)
    refused = Conflict(f"Cannot {action} a job in state '{state}'.", code="invalid_job_state")
    if state in _UNCONTROLLABLE or (state == "cancelling" and action != "cancel"):
        raise refused
    if action != "cancel" and batch.status not in _PAUSABLE:  # finalizing: its answer is in
        raise Conflict(
            f"Cannot {action} a job whose answer is being saved (state '{state}').",
            code="invalid_job_state",
        )
    act: Any = {
        "pause": batches.pause_batch,
        "resume": batches.resume_batch,
        "cancel": batches.cancel_batch,
    }[action]
    try:
        return await act(job_id, client, identity)  # type: ignore[no-any-return]
    except Conflict as err:  # the batch moved on since it was read: a job's code, not a batch's
        raise Conflict(err.message, code="invalid_job_state") from None


@router.post("/{job_id}/pause", response_model=Job, responses=error_responses(403, 404, 409))
async def pause_job(job_id: str, client: ClientDep, store: StoreDep, identity: IdentityDep) -> Job:
    """Hold the job back (`pausing` while an attempt is in flight, then `paused`)."""
    return await control("pause", job_id, client, store, identity)


@router.post("/{job_id}/resume", response_model=Job, responses=error_responses(403, 404, 409))
async def resume_job(job_id: str, client: ClientDep, store: StoreDep, identity: IdentityDep) -> Job:
    """Let a paused job run again (`queued`)."""
    return await control("resume", job_id, client, store, identity)


@router.post("/{job_id}/cancel", response_model=Job, responses=error_responses(403, 404, 409))
async def cancel_job(job_id: str, client: ClientDep, store: StoreDep, identity: IdentityDep) -> Job:
    """Cancel the job (`cancelling`, then `cancelled`); an attempt in flight finishes."""
    return await control("cancel", job_id, client, store, identity)
