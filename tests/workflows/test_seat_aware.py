"""Seat-aware admission on the real dev server: the route scheduler's allotment follows every
live count an api process reports, min("Batch lines at once", seats − keep_free − live), and
closes the route when no seat is left (the real RouteSchedulerWorkflow; the batch is a
stand-in that records and acknowledges its allotments)."""

from __future__ import annotations

import time

import pytest
from temporalio.client import Client

from backfill.routes.gates.live import LiveReport
from backfill.routes.reasons import WaitReason
from backfill.routes.settings import RouteSettings
from backfill.routes.status import SchedulerStatus
from tests.polling import poll_until
from tests.workflows.seat_route import seat_route
from workflows.scheduler import RouteSchedulerWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_the_allotment_follows_the_live_reports(temporal_client: Client) -> None:
    settings = RouteSettings(max_concurrent_lines=8, seat_aware={"seats": 10, "keep_free": 2})
    async with seat_route(temporal_client, "seats", settings) as r:
        scheduler = r.scheduler

        async def last_allotment() -> int | None:
            sent = await r.allotments()
            return sent[-1] if sent else None

        async def follows(live: int | None, expected: int) -> SchedulerStatus:
            if live is not None:
                report = LiveReport(process="api-1", in_flight=live)
                await scheduler.signal("report_live", report)
            await poll_until(
                last_allotment, lambda n: n == expected, timeout=30, what=f"{expected}"
            )
            return await scheduler.query(RouteSchedulerWorkflow.status, time.time())

        assert (await follows(None, 8)).limit == 8  # 10 − 2 − 0 ≥ the cap of 8
        status = await follows(3, 5)  # 10 − 2 − 3
        assert (status.state, status.limit, status.live_in_flight) == ("open", 5, 3)
        status = await follows(8, 0)  # no seat left: the route closes
        assert (status.state, status.reason) == ("paused", WaitReason.SEATS)
        assert (await follows(1, 7)).state == "open"
        assert (await follows(0, 8)).limit == 8
        sent = iter(await r.allotments())
        assert all(n in sent for n in (8, 5, 0, 7, 8))  # in this order
