"""backfill/routes/gates/window.py runs inside the Temporal workflow sandbox when passed through
(zoneinfo objects are restricted proxies there), on the time-skipping test server, and gives the
same answers as outside it. (Imported without passing through, its workflow task fails with
TypeError and the execution times out.)"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel
from temporalio import workflow
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tools.dev.devserver import test_server_path

with workflow.unsafe.imports_passed_through():
    from backfill.routes.gates.window import TimeWindow, window_state

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Probe(BaseModel):
    window: TimeWindow
    at: datetime | None
    """Instant to evaluate; None: `workflow.now()`."""


class ProbeResult(BaseModel):
    at: datetime
    open: bool
    next_change: datetime | None


@workflow.defn(sandboxed=True)
class WindowProbeWorkflow:
    @workflow.run
    async def run(self, probe: Probe) -> ProbeResult:
        at = probe.at or workflow.now()
        state = window_state(probe.window, at)
        return ProbeResult(at=at, open=state.open, next_change=state.next_change)


async def test_window_math_in_the_sandbox() -> None:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(test_server_path()),
        data_converter=pydantic_data_converter,
    )
    try:
        queue = f"tq-{uuid.uuid4().hex[:6]}"
        async with Worker(env.client, task_queue=queue, workflows=[WindowProbeWorkflow]):
            overnight = TimeWindow.model_validate(
                {
                    "time_zone": "America/New_York",
                    "days": ["sat"],
                    "from": "22:00",
                    "until": "02:30",
                }
            )
            # The night the clocks go forward: the end (02:30) is skipped, so it closes at 03:00
            # EDT (07:00 UTC).
            at = datetime(2025, 3, 9, 4, 0, tzinfo=UTC)
            got = await env.client.execute_workflow(
                WindowProbeWorkflow.run,
                Probe(window=overnight, at=at),
                id=f"probe-{uuid.uuid4().hex[:6]}",
                task_queue=queue,
                execution_timeout=timedelta(minutes=1),
            )
            assert got.open is True
            assert got.next_change == datetime(2025, 3, 9, 7, 0, tzinfo=UTC)

            sydney = TimeWindow.model_validate(
                {
                    "time_zone": "Australia/Sydney",
                    "days": ["mon"],
                    "from": "09:00",
                    "until": "17:00",
                }
            )
            got = await env.client.execute_workflow(
                WindowProbeWorkflow.run,
                Probe(window=sydney, at=None),
                id=f"probe-{uuid.uuid4().hex[:6]}",
                task_queue=queue,
                execution_timeout=timedelta(minutes=1),
            )
            outside = window_state(sydney, got.at)
            assert (got.open, got.next_change) == (outside.open, outside.next_change)
            assert got.next_change is not None and got.next_change > got.at
    finally:
        await env.shutdown()
