"""The maintenance hold in the real route scheduler, on the time-skipping server: a route held
from one hour to three hours from now is open before the hold, says "Held for maintenance" (with
its end) during it, gives a batch created during the hold no line, and starts its lines when
the hold ends: on the scheduler's timer at `end` (within 30 s of skipped time), not at a later
keep-alive."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.client import WorkflowExecutionStatus

from backfill.platform import refs
from backfill.routes.gates.maintenance import MaintenanceHold
from backfill.routes.reasons import WaitReason
from backfill.routes.settings import RouteSettings
from tests.polling import poll_until
from tests.workflows.test_expiry import (
    Harness,
    harness_worker,
    start_batch,
    start_scheduler,
    time_skipping_env,
)
from workflows.batch import BatchWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session")
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    env = await time_skipping_env()
    h = Harness(env, tmp_path)
    async with harness_worker(h, h.run_line):
        yield h
    await env.shutdown()


async def test_lines_wait_through_the_hold_and_start_when_it_ends(harness: Harness) -> None:
    h = harness
    now = await h.env.get_current_time()
    start, end = now + timedelta(hours=1), now + timedelta(hours=3)
    hold = MaintenanceHold(start=start, end=end)
    scheduler = await start_scheduler(h, RouteSettings(max_concurrent_lines=1, maintenance=hold))

    async def route_as_of_now() -> tuple[str, str | None, str | None]:
        at = await h.env.get_current_time()
        status = await scheduler.query(refs.RouteSchedulerWorkflow.status, at.timestamp())
        return status.state, status.reason, status.reason_detail

    assert await route_as_of_now() == ("open", None, None)
    first, _ = await start_batch(h, 2, "24h")  # before the hold: it runs
    done = await h.client.get_workflow_handle_for(BatchWorkflow.run, first).result()
    assert done.status == "completed" and len(h.starts) == 2
    assert all(t < start for t in h.starts)

    await h.env.sleep(start + timedelta(minutes=10) - await h.env.get_current_time())
    held = ("paused", WaitReason.MAINTENANCE, f"until {end.isoformat()}")
    assert await route_as_of_now() == held

    second, _ = await start_batch(h, 3, "24h")
    handle = h.client.get_workflow_handle_for(BatchWorkflow.run, second)

    async def waiting() -> list[tuple[int, int, str | None]]:
        status = await scheduler.query(refs.RouteSchedulerWorkflow.status)
        return [(b.wanted, b.allotment, b.reason) for b in status.batches if b.batch_id == second]

    # What `GET /v1/batches/{id}` shows as the batch's reason on the route.
    await poll_until(
        waiting,
        lambda mine: mine == [(3, 0, WaitReason.MAINTENANCE)],
        timeout=60,
        what="the second batch to wait on the route for the hold",
    )
    assert len(h.starts) == 2

    await h.env.sleep(end + timedelta(seconds=30) - await h.env.get_current_time())

    async def ended() -> bool:
        return (await handle.describe()).status != WorkflowExecutionStatus.RUNNING

    await poll_until(ended, timeout=60, what="the second batch to end after the hold")
    batch = await handle.result()
    assert batch.status == "completed" and batch.request_counts.completed == 3
    later = sorted(h.starts[2:])
    assert len(later) == 3
    assert end <= later[0] < end + timedelta(minutes=1), (end, later)
    assert await route_as_of_now() == ("open", None, None)
