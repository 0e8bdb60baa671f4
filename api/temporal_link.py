"""The api's link to Temporal, built so that nothing else in the api waits on Temporal.

- The api starts without Temporal: `TemporalLink` connects in the background, retrying, and
  until the first connection succeeds the endpoints that need Temporal answer 503
  (`TemporalUnavailable`). The live proxy, `/v1/models`, the Files API, `/metrics` and
  `/healthz` never touch it. Once connected, the SDK's client reconnects by itself after the
  server comes back.
- Every RPC is bounded: `BoundedRPCs` gives each call a deadline (`RPC_TIMEOUT`) unless the
  caller set one, and bounds a whole call (including an update's polling for its outcome) by
  `CALL_TIMEOUT`: starts, describes, queries, signals, updates, cancels, terminates, counts,
  and each page of a listing or a history. A stopped server fails fast (connection refused,
  retried for at most `RETRY.max_elapsed_time_millis`); a frozen one fails at the deadline.
  Either way the error handler in `api.errors` answers 503 `temporal_unavailable` instead of
  hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import (
    CancelWorkflowInput,
    Client,
    CountWorkflowsInput,
    DescribeWorkflowInput,
    Interceptor,
    OutboundInterceptor,
    QueryWorkflowInput,
    SignalWorkflowInput,
    StartWorkflowInput,
    StartWorkflowUpdateInput,
    StartWorkflowUpdateWithStartInput,
    TerminateWorkflowInput,
    WorkflowExecutionCount,
    WorkflowExecutionDescription,
    WorkflowHandle,
    WorkflowUpdateHandle,
)
from temporalio.service import RetryConfig, RPCError, RPCStatusCode

from api.errors import TemporalUnavailable

log = logging.getLogger(__name__)

RPC_TIMEOUT = timedelta(seconds=5)
"""Deadline of one RPC the api makes (a describe, a query, a signal, a start)."""
CALL_TIMEOUT = 10.0
"""Bound on one whole client call in seconds, retries and update polling included."""
HEALTH_TIMEOUT = timedelta(seconds=2)
RETRY = RetryConfig(max_elapsed_time_millis=3000, max_retries=6)
"""Retries of unavailable-server errors: a stopped server is reported within ~3 s."""
T = TypeVar("T")


class BoundedRPCs(Interceptor):
    """Client interceptor: a default deadline on each RPC and a bound on each whole call."""

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _BoundedOutbound(next)


def _with_deadline(input: T) -> T:
    if getattr(input, "rpc_timeout", None) is None:
        return dataclasses.replace(input, rpc_timeout=RPC_TIMEOUT)  # type: ignore[type-var]
    return input


async def _bounded(call: Awaitable[T]) -> T:
    try:
        async with asyncio.timeout(CALL_TIMEOUT):
            return await call
    except TimeoutError:
        raise RPCError(
            f"no answer within {CALL_TIMEOUT:g} s", RPCStatusCode.DEADLINE_EXCEEDED, b""
        ) from None


class _BoundedOutbound(OutboundInterceptor):
    async def start_workflow(self, input: StartWorkflowInput) -> WorkflowHandle[Any, Any]:
        return await _bounded(super().start_workflow(_with_deadline(input)))

    async def describe_workflow(self, input: DescribeWorkflowInput) -> WorkflowExecutionDescription:
        return await _bounded(super().describe_workflow(_with_deadline(input)))

    async def query_workflow(self, input: QueryWorkflowInput) -> Any:
        return await _bounded(super().query_workflow(_with_deadline(input)))

    async def signal_workflow(self, input: SignalWorkflowInput) -> None:
        await _bounded(super().signal_workflow(_with_deadline(input)))

    async def count_workflows(self, input: CountWorkflowsInput) -> WorkflowExecutionCount:
        return await _bounded(super().count_workflows(_with_deadline(input)))

    async def cancel_workflow(self, input: CancelWorkflowInput) -> None:
        await _bounded(super().cancel_workflow(_with_deadline(input)))

    async def terminate_workflow(self, input: TerminateWorkflowInput) -> None:
        await _bounded(super().terminate_workflow(_with_deadline(input)))

    async def start_update_with_start_workflow(
        self, input: StartWorkflowUpdateWithStartInput
    ) -> WorkflowUpdateHandle[Any]:
        return await _bounded(super().start_update_with_start_workflow(_with_deadline(input)))

    async def start_workflow_update(
        self, input: StartWorkflowUpdateInput
    ) -> WorkflowUpdateHandle[Any]:
        return await _bounded(super().start_workflow_update(_with_deadline(input)))

    def list_workflows(self, input: Any) -> Any:
        """Each page under the deadline (a page is at most `page_size` rows; the listings
        bound how many pages they read)."""
        return super().list_workflows(_with_deadline(input))

    def fetch_workflow_history_events(self, input: Any) -> Any:
        return super().fetch_workflow_history_events(_with_deadline(input))


class TemporalLink:
    """The api's Temporal client, connected in the background; `client()` or 503."""

    def __init__(self, connect: Callable[[], Awaitable[Client]]) -> None:
        self._connect = connect
        self._client: Client | None = None
        self._last_error: str | None = "not connected yet"
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def connected(cls, client: Client) -> TemporalLink:
        """A link over a client made elsewhere (tests)."""
        link = cls(lambda: asyncio.sleep(0, client))
        link._client, link._last_error = client, None
        return link

    def client(self) -> Client:
        if self._client is None:
            raise TemporalUnavailable()
        return self._client

    def start(self) -> None:
        if self._client is None and self._task is None:
            self._task = asyncio.create_task(self._connect_until_done(), name="temporal-connect")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _connect_until_done(self) -> None:
        delay = 0.5
        while self._client is None:
            try:
                async with asyncio.timeout(CALL_TIMEOUT):
                    self._client = await self._connect()
                self._last_error = None
                log.info("connected to Temporal")
                return
            except Exception as err:  # keep trying: the api serves live traffic meanwhile
                self._last_error = _short(err)
                log.warning("Temporal not reachable yet (retrying in %.1f s): %s", delay, err)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def check(self) -> str | None:
        """None if Temporal answers now, else a short description of what is wrong."""
        if self._client is None:
            return self._last_error or "not connected yet"
        try:
            await self._client.workflow_service.get_system_info(
                GetSystemInfoRequest(), timeout=HEALTH_TIMEOUT
            )
        except Exception as err:
            return _short(err)
        return None


def _short(err: BaseException) -> str:
    return (str(err) or type(err).__name__)[:200]
