"""The api's side of per-workspace admission (decision 0020): reserve a batch's slot in the
workspace's `AdmissionWorkflow` before starting the batch, release it when the start failed,
and read the pinned inputs it holds for the storage quota.

Limits hold whatever the workers do (decision 0027): the admission workflow is the only count,
so when it does not answer (no worker polls, a backlog) the create or the upload that needs it
is refused with 503 `admission_unavailable` and `Retry-After`, never admitted by a guess."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from api.batches.history_view import quick_query
from api.errors import RetryLater, TemporalUnavailable, TooManyRequests
from backfill.batches import search_attributes as sa
from backfill.platform.config import Settings
from backfill.platform.refs import AdmissionWorkflow
from backfill.tenancy.admission import (
    AdmissionInput,
    ReleaseRequest,
    Reservation,
    ReserveRequest,
    admission_workflow_id,
)

log = logging.getLogger(__name__)

RESERVE_TIMEOUT = timedelta(seconds=5)
"""How long one reserve call waits for the admission workflow's answer. It needs a worker (its
workflow task shares the task queue with every batch's)."""

TURN_WAIT = 60.0
"""The most a create waits for its turn in this process (a burst in one workspace), in seconds."""

RETRY_AFTER_SECONDS = 10
"""`Retry-After` of a 503 `admission_unavailable`: a worker restart or a short backlog."""

IN_FLIGHT_PER_WORKSPACE = 4
"""Reserve calls one api process has in flight per workspace at once. Temporal refuses more than
10 in-flight updates per workflow (RESOURCE_EXHAUSTED); the rest of a burst waits its turn here,
and a refusal caused by other api processes is retried within `RESERVE_TIMEOUT`."""

_RETRY_PAUSE = 0.05
"""First pause before trying again after RESOURCE_EXHAUSTED (doubling, at most 1 s)."""


@dataclass
class _Workspace:
    """This process's admission state of one workspace (per event loop)."""

    turns: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(IN_FLIGHT_PER_WORKSPACE)
    )
    unanswered: float = float("-inf")
    """When (event-loop time) a reserve last went unanswered: the creates waiting their turn
    then are refused at once, not after 5 s each."""


_state: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Workspace]] = (
    weakref.WeakKeyDictionary()
)


def _of(workspace: str) -> _Workspace:
    return _state.setdefault(asyncio.get_running_loop(), {}).setdefault(workspace, _Workspace())


def _no_answer(workspace: str, what: str) -> RetryLater:
    return RetryLater(
        f"Workspace {workspace!r}'s admission did not answer in time, so {what} cannot be "
        f"counted against its limits now (no worker is polling, or they are behind); "
        f"try again in {RETRY_AFTER_SECONDS} s.",
        retry_after=RETRY_AFTER_SECONDS,
        code="admission_unavailable",
    )


@asynccontextmanager
async def _turn(workspace: str) -> AsyncIterator[None]:
    """Hold one of this process's `IN_FLIGHT_PER_WORKSPACE` reserve slots of `workspace`; 503
    when a reserve went unanswered while this one waited."""
    state = _of(workspace)
    asked = asyncio.get_running_loop().time()
    try:
        await asyncio.wait_for(state.turns.acquire(), TURN_WAIT)
    except TimeoutError:
        raise _no_answer(workspace, "this batch") from None
    try:
        if state.unanswered >= asked:
            raise _no_answer(workspace, "this batch")
        yield
    finally:
        state.turns.release()


async def reserve(client: Client, settings: Settings, workspace: str, req: ReserveRequest) -> None:
    """Take a slot for `req.batch_id`, or raise 429 naming the limit that refused it, or 503
    `admission_unavailable` (with `Retry-After`) when the admission workflow did not answer
    within `RESERVE_TIMEOUT`."""
    start = WithStartWorkflowOperation(
        AdmissionWorkflow.run,
        AdmissionInput(workspace=workspace, check_seconds=settings.scheduler_reconcile_seconds),
        id=admission_workflow_id(workspace),
        task_queue=settings.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"Admission of workspace {workspace}'s batches",
    )
    async with _turn(workspace):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RESERVE_TIMEOUT.total_seconds()
        pause = _RETRY_PAUSE
        while True:
            left = deadline - loop.time()
            try:
                result = await client.execute_update_with_start_workflow(
                    AdmissionWorkflow.reserve,
                    req,
                    start_workflow_operation=start,
                    rpc_timeout=timedelta(seconds=max(0.5, left)),
                )
                break
            except RPCError as err:
                if err.status == RPCStatusCode.RESOURCE_EXHAUSTED and left > pause:
                    await asyncio.sleep(pause)  # other processes' updates in flight: a turn
                    pause = min(1.0, pause * 2)
                    continue
                if err.status not in _NO_ANSWER + (RPCStatusCode.RESOURCE_EXHAUSTED,):
                    raise
                if err.status == RPCStatusCode.UNAVAILABLE:  # Temporal itself, not the workers
                    await _gave_up(client, workspace, req.batch_id)
                    raise TemporalUnavailable() from None
            except WorkflowUpdateRPCTimeoutOrCancelledError:
                pass
            _of(workspace).unanswered = loop.time()
            await _gave_up(client, workspace, req.batch_id)
            raise _no_answer(workspace, "this batch")
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
    if not result.accepted:  # released before it was decided: only a retried create sees this
        raise _no_answer(workspace, "this batch")


async def _gave_up(client: Client, workspace: str, batch_id: str) -> None:
    """The create answers 503, but its update may still be decided once a worker polls: release
    it now, so the workflow drops the reservation, or refuses it when it comes later."""
    log.warning("no answer to the admission of %s in %s: refused 503", batch_id, workspace)
    await release(client, workspace, batch_id)


async def release(client: Client, workspace: str, batch_id: str) -> None:
    """Give back the slot of a batch that was not started (best effort: the workflow's own
    check drops it later anyway)."""
    handle = client.get_workflow_handle_for(AdmissionWorkflow.run, admission_workflow_id(workspace))
    try:
        await handle.signal(AdmissionWorkflow.release, ReleaseRequest(batch_id=batch_id))
    except RPCError as err:
        log.warning("could not release the admission of %s: %s", batch_id, err)


async def held(client: Client, workspace: str) -> list[Reservation]:
    """The workspace's reservations (none when it never created a batch), so the storage quota
    counts the pinned inputs of its running batches. When the admission workflow does not answer
    in time this is 503 `admission_unavailable`: an upload under a storage limit is not counted
    without them (decision 0027)."""
    handle = client.get_workflow_handle_for(AdmissionWorkflow.run, admission_workflow_id(workspace))
    try:
        view = await quick_query(handle, AdmissionWorkflow.holdings)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return []
        if err.status == RPCStatusCode.UNAVAILABLE:  # Temporal itself cannot be reached
            raise TemporalUnavailable() from None
        if err.status in _NO_ANSWER or err.status == RPCStatusCode.RESOURCE_EXHAUSTED:
            raise _no_answer(workspace, "this upload") from None
        raise
    return view.reservations


@dataclass
class Pinned:
    """The pinned inputs an upload's storage count includes (`pinned`)."""

    held: list[Reservation]
    """The workspace's reservations (their deleted inputs count exactly)."""
    bound: int = 0
    """When admission did not answer: the most bytes the pinned inputs could take (each running
    batch's input at `limits.max_file_bytes`), counted instead; 0 when `held` is exact."""
    unanswered: RetryLater | None = None
    """The 503 to answer when only that bound stands between the upload and the limit."""


async def pinned(client: Client, settings: Settings, workspace: str) -> Pinned:
    """What the storage quota counts for pinned inputs: the reservations, or, while admission
    does not answer, an upper bound from Temporal's visibility count of the workspace's running
    batches, so an upload that fits even then needs no worker, and one that might not is
    refused 503 rather than let through on a guess."""
    try:
        return Pinned(held=await held(client, workspace))
    except RetryLater as unanswered:
        query = (
            f"WorkflowType = 'BatchWorkflow' AND ExecutionStatus = 'Running' "
            f"AND {sa.WORKSPACE.name} = '{sa.quote(workspace)}'"
        )
        try:
            running = (await client.count_workflows(query)).count
        except RPCError as err:
            if err.status == RPCStatusCode.UNAVAILABLE:
                raise TemporalUnavailable() from None
            raise unanswered from None
        return Pinned(
            held=[], bound=running * settings.limits.max_file_bytes, unanswered=unanswered
        )


_NO_ANSWER = (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED, RPCStatusCode.UNAVAILABLE)
"""An update nobody answered in time (no worker polls the task queue): Temporal itself may be up.
UNAVAILABLE (Temporal cannot be reached at all) answers 503 `temporal_unavailable` instead, the
code every other batch endpoint answers then: the operator is sent to Temporal, not the workers."""
