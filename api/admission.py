"""The api's side of per-workspace admission (decision 0020): reserve a batch's slot in the
workspace's `AdmissionWorkflow` before starting the batch, release it when the start failed,
and read the pinned inputs it holds for the storage quota."""

from __future__ import annotations

import logging
from datetime import timedelta

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from api.errors import TemporalUnavailable, TooManyRequests
from api.history_view import quick_query
from backfill import search_attributes as sa
from backfill.admission import (
    AdmissionInput,
    ReleaseRequest,
    Reservation,
    ReserveRequest,
    admission_workflow_id,
)
from backfill.config import Settings
from backfill.refs import AdmissionWorkflow

log = logging.getLogger(__name__)

RESERVE_TIMEOUT = timedelta(seconds=5)
"""How long a create waits for the admission workflow's answer. It needs a worker (its workflow
task shares the task queue with every batch's); when none answers in time, the create is
admitted by Temporal's visibility count instead (`_admit_by_visibility`), so creating a batch
never depends on a worker being up."""


async def reserve(client: Client, settings: Settings, workspace: str, req: ReserveRequest) -> None:
    """Take a slot for `req.batch_id`, or raise 429 naming the limit that refused it."""
    start = WithStartWorkflowOperation(
        AdmissionWorkflow.run,
        AdmissionInput(workspace=workspace, check_seconds=settings.scheduler_reconcile_seconds),
        id=admission_workflow_id(workspace),
        task_queue=settings.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"Admission of workspace {workspace}'s batches",
    )
    try:
        result = await client.execute_update_with_start_workflow(
            AdmissionWorkflow.reserve,
            req,
            start_workflow_operation=start,
            rpc_timeout=RESERVE_TIMEOUT,
        )
    except (WorkflowUpdateRPCTimeoutOrCancelledError, RPCError) as err:
        if isinstance(err, RPCError) and err.status not in _NO_ANSWER:
            raise
        await _admit_by_visibility(client, workspace, req)
        return
    if result.refused_by == "max_active_batches":
        raise TooManyRequests(
            f"Workspace {workspace!r} already has {result.active} batches queued or running, "
            f"its limit is {req.max_active_batches}; wait for one to end before creating another.",
            code="batch_limit_exceeded",
        )
    if result.refused_by == "max_queued_lines":
        raise TooManyRequests(
            f"Workspace {workspace!r} has {result.lines} lines in batches queued or running; "
            f"this batch's {req.lines} more would pass its limit of {req.max_queued_lines}.",
            code="line_limit_exceeded",
        )


async def release(client: Client, workspace: str, batch_id: str) -> None:
    """Give back the slot of a batch that was not started (best effort: the workflow's own
    check drops it later anyway)."""
    handle = client.get_workflow_handle_for(AdmissionWorkflow.run, admission_workflow_id(workspace))
    try:
        await handle.signal(AdmissionWorkflow.release, ReleaseRequest(batch_id=batch_id))
    except RPCError as err:
        log.warning("could not release the admission of %s: %s", batch_id, err)


async def held(client: Client, workspace: str) -> list[Reservation]:
    """The workspace's reservations (none when it never created a batch).

    An upload must not depend on a worker being up: when no worker answers in time, this is
    empty (logged), and the storage count leaves out the pinned inputs of deleted files until a
    worker answers again (docs/configuration.md)."""
    handle = client.get_workflow_handle_for(AdmissionWorkflow.run, admission_workflow_id(workspace))
    try:
        view = await quick_query(handle, AdmissionWorkflow.holdings)
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            log.warning(
                "storage count of %s without its batches' pinned inputs: %s", workspace, err
            )
        return []
    return view.reservations


_NO_ANSWER = (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED, RPCStatusCode.UNAVAILABLE)
"""An update nobody answered in time (no worker polls the task queue): Temporal itself may be up."""


async def _admit_by_visibility(client: Client, workspace: str, req: ReserveRequest) -> None:
    """Admission while no worker answers: the active-batch limit checked against Temporal's
    visibility count (it lags by up to a second, so creates racing in that moment may pass the
    limit by a few) and the queued-lines limit not checked. The batch gets no reservation: the
    admission workflow counts it once a worker runs again only if its own check sees it, so the
    count may be low by the batches admitted this way until they end (decision 0020)."""
    log.warning("no worker answered the admission of %s in time: admitted by visibility", workspace)
    if req.max_active_batches is None:
        return
    query = (
        f"WorkflowType = 'BatchWorkflow' AND ExecutionStatus = 'Running' "
        f"AND {sa.WORKSPACE.name} = '{sa.quote(workspace)}'"
    )
    try:
        active = (await client.count_workflows(query)).count
    except RPCError:
        raise TemporalUnavailable("Temporal did not answer the batch admission.") from None
    if active >= req.max_active_batches:
        raise TooManyRequests(
            f"Workspace {workspace!r} already has {active} batches queued or running, "
            f"its limit is {req.max_active_batches}; wait for one to end before creating another.",
            code="batch_limit_exceeded",
        )
