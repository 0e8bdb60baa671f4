"""Every Temporal call the api makes while serving a request has a deadline: a Temporal that
accepts the call and never answers (frozen, or behind a stalled network) costs a request at
most `CALL_TIMEOUT`, then the documented 503 `temporal_unavailable`, never a request that
hangs. The calls go through `api.temporal_link.BoundedRPCs` to a next interceptor that never
answers."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import (
    CancelWorkflowInput,
    CountWorkflowsInput,
    OutboundInterceptor,
    TerminateWorkflowInput,
)
from temporalio.service import RPCError, RPCStatusCode

from api import temporal_link
from api.errors import TEMPORAL_TRANSIENT
from api.temporal_link import RPC_TIMEOUT, BoundedRPCs

CALL_BOUND = 0.3
"""The whole-call bound in these tests (`CALL_TIMEOUT`, made short)."""


class NeverAnswers(OutboundInterceptor):
    """Temporal that takes every call and never answers; records each call's deadline."""

    def __init__(self) -> None:
        self.deadlines: list[timedelta | None] = []

    async def _hang(self, input: Any) -> Any:
        self.deadlines.append(input.rpc_timeout)
        await asyncio.Event().wait()

    count_workflows = cancel_workflow = terminate_workflow = _hang  # type: ignore[assignment]


INPUTS = {
    "count_workflows": CountWorkflowsInput(
        query="WorkflowType = 'BatchWorkflow'", rpc_metadata={}, rpc_timeout=None
    ),
    "cancel_workflow": CancelWorkflowInput(
        id="batch_1",
        run_id=None,
        first_execution_run_id=None,
        reason="",
        rpc_metadata={},
        rpc_timeout=None,
    ),
    "terminate_workflow": TerminateWorkflowInput(
        id="batch_1",
        run_id=None,
        first_execution_run_id=None,
        args=[],
        reason=None,
        rpc_metadata={},
        rpc_timeout=None,
    ),
}


@pytest.mark.parametrize("call", sorted(INPUTS))
async def test_a_call_temporal_never_answers_ends_at_the_deadline_as_unavailable(
    call: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(temporal_link, "CALL_TIMEOUT", CALL_BOUND)
    temporal = NeverAnswers()
    bounded = BoundedRPCs().intercept_client(temporal)
    began = time.monotonic()
    with pytest.raises(RPCError) as err:
        # The outer bound only keeps a failing test from hanging the suite.
        await asyncio.wait_for(getattr(bounded, call)(INPUTS[call]), timeout=10)
    took = time.monotonic() - began
    assert err.value.status == RPCStatusCode.DEADLINE_EXCEEDED
    assert err.value.status in TEMPORAL_TRANSIENT  # the error handler answers 503
    assert took < 5, took
    assert temporal.deadlines == [RPC_TIMEOUT]  # and the RPC itself carried its deadline
