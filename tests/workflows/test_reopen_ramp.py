"""The reopen ramp on the real dev server: when "Yield to live traffic" reopens the route, the
route scheduler hands the freed slots out 1, 2, 4, 8 (one doubling per timer), not 0 → 8 (the
real RouteSchedulerWorkflow; the batch is a stand-in that records and acknowledges its
allotments)."""

from __future__ import annotations

import time

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from backfill.routes.gates.live import LiveReport
from backfill.routes.reasons import WaitReason
from backfill.routes.settings import RouteSettings
from tests.polling import poll_until
from tests.workflows.events import patch_marker, signaled
from tests.workflows.seat_route import seat_route
from workflows.patches import REOPEN_RAMP
from workflows.scheduler import RouteSchedulerWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")

DOUBLE_EVERY_S = 1.5


async def test_a_reopened_route_ramps_its_allotments_up(temporal_client: Client) -> None:
    settings = RouteSettings(
        max_concurrent_lines=8,
        yield_to_live_traffic={"pause_at_in_flight": 1},
        reopen_ramp={"initial": 1, "double_every_s": DOUBLE_EVERY_S},
    )
    async with seat_route(temporal_client, "ramp", settings) as r:
        scheduler, allotments = r.scheduler, r.allotments

        # An open route from the start: its limit at once (a ramp follows a rise only).
        await poll_until(allotments, lambda a: a == [8], timeout=30, what="the first allotment")

        async def held() -> int:
            return (await scheduler.query(RouteSchedulerWorkflow.status, time.time())).held

        await scheduler.signal("report_live", LiveReport(process="api-1", in_flight=1))
        await poll_until(allotments, lambda a: a[-1:] == [0], timeout=30, what="the route closed")
        await poll_until(held, lambda n: n == 0, timeout=30, what="the running lines ended")
        await scheduler.signal("report_live", LiveReport(process="api-1", in_flight=0))
        await poll_until(allotments, lambda a: a[-1:] == [1], timeout=30, what="one line first")
        status = await scheduler.query(RouteSchedulerWorkflow.status, time.time())
        assert (status.ramping_to, status.reason) == (8, WaitReason.RAMP)
        assert status.limit < 8

        sent = await poll_until(allotments, lambda a: a[-1:] == [8], timeout=30, what="all 8")
        assert sent == [8, 0, 1, 2, 4, 8]
        status = await scheduler.query(RouteSchedulerWorkflow.status, time.time())
        assert (status.limit, status.ramping_to) == (8, None)

        # After the reopen, one timer per doubling; the patch marker is recorded.
        history = await scheduler.fetch_history()
        reopened = max(
            i
            for i, e in enumerate(history.events)
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            and signaled("report_live")(e)
        )
        timers = [
            e
            for e in history.events[reopened:]
            if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
        ]
        assert len(timers) == 3, timers
        assert any(patch_marker(REOPEN_RAMP)(e) for e in history.events)
