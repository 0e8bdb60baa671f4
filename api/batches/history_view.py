"""What Temporal itself knows of a workflow, read without a worker: the input it was started
with (or continued as) and the updates it accepted since, from the current run's history.

The api asks a workflow first (a query, bounded by `QUICK_QUERY`); a query needs a worker to
answer, so when none is running the api answers from here instead and marks the answer stale.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

QUICK_QUERY = timedelta(seconds=2)
"""Deadline of a query the api can answer without (a worker answers one in milliseconds)."""
QUICK_QUERY_GRACE = 0.5
"""Seconds past `QUICK_QUERY` the whole call may take (the server's own answer to a deadline
that passed is on its way by then)."""
T = TypeVar("T")
R = TypeVar("R")


async def quick_query(handle: WorkflowHandle[Any, Any], query: Callable[..., R], *args: Any) -> R:
    """Ask the workflow, bounded in all by `QUICK_QUERY` (plus a grace): the SDK sends a query
    again when its RPC deadline passes, so `rpc_timeout` alone let one unanswered query (no
    worker) take 5 to 9 s. Running out raises `RPCError(DEADLINE_EXCEEDED)`, as the server's
    own timeout does, so callers handle both alike. So does the server's refusal when no worker
    polled the task queue recently (FAILED_PRECONDITION "no poller seen", e.g. just after
    Temporal restarted): nobody will answer, which is the same as no answer in time."""
    call = handle.query(query, *args, rpc_timeout=QUICK_QUERY)  # type: ignore[call-overload]
    try:
        return await asyncio.wait_for(call, QUICK_QUERY.total_seconds() + QUICK_QUERY_GRACE)  # type: ignore[no-any-return]
    except TimeoutError:
        raise RPCError(
            f"query unanswered within {QUICK_QUERY.total_seconds():g} s",
            RPCStatusCode.DEADLINE_EXCEEDED,
            b"",
        ) from None
    except RPCError as err:
        if err.status != RPCStatusCode.FAILED_PRECONDITION:
            raise
        raise RPCError(
            f"query unanswered: {err.message}", RPCStatusCode.DEADLINE_EXCEEDED, b""
        ) from None


async def started_input(client: Client, workflow_id: str, input_type: type[T]) -> T:
    """The input of the workflow's current run (the first run's, or what it continued as)."""
    handle = client.get_workflow_handle(workflow_id)
    async for event in handle.fetch_history_events(page_size=1):
        return await _decode(client, event, input_type)
    raise LookupError(f"workflow {workflow_id} has no history")


async def _decode(client: Client, event: HistoryEvent, input_type: type[T]) -> T:
    payloads = event.workflow_execution_started_event_attributes.input.payloads
    [value] = await client.data_converter.decode(payloads, [input_type])
    return value  # type: ignore[no-any-return]


async def started_input_and_updates(
    client: Client, workflow_id: str, input_type: type[T], update: str, arg_type: type[Any]
) -> tuple[T, list[Any]]:
    """The current run's input and the argument of each `update` it accepted since, in order."""
    handle = client.get_workflow_handle(workflow_id)
    first: T | None = None
    args: list[Any] = []
    async for event in handle.fetch_history_events():
        if first is None and event.HasField("workflow_execution_started_event_attributes"):
            first = await _decode(client, event, input_type)
        elif event.HasField("workflow_execution_update_accepted_event_attributes"):
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            if request.input.name == update:
                [arg] = await client.data_converter.decode(request.input.args.payloads, [arg_type])
                args.append(arg)
    if first is None:
        raise LookupError(f"workflow {workflow_id} has no history")
    return first, args
