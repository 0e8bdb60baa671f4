"""Deadline-aware shares on the time-skipping test server: the real RouteSchedulerWorkflow and
two stand-in batches whose lines each hold a slot for an hour (tests/workflows/paced_batch.py).

A 24-hour batch submitted an hour behind a 168-hour one, on a route with 2 slots that can serve
both within their windows (230 line-hours; the 24-hour one needs both slots for 15 hours): with
fair shares (1 + 1) the 24-hour batch runs 1 line an hour and expires with 6 of its 30 lines
undone; with deadline-aware shares it gets both slots, and both batches finish in time."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from backfill.platform.ids import scheduler_workflow_id
from backfill.platform.messages import SchedulerInput
from backfill.routes.settings import RouteSettings
from tests.workflows.ending import terminate_if_running
from tests.workflows.events import E, patch_marker, require
from tests.workflows.paced_batch import PacedBatch, PacedBatchWorkflow, PacedOutcome
from tests.workflows.seat_route import none_closed
from tests.workflows.test_expiry import time_skipping_env
from workflows.patches import DEADLINE_AWARE_SHARES
from workflows.scheduler import RouteSchedulerWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")

HOUR = 3600.0


@pytest_asyncio.fixture(loop_scope="session")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    env = await time_skipping_env()
    try:
        yield env
    finally:
        await env.shutdown()


async def test_a_24h_batch_behind_a_168h_batch_finishes_and_so_does_the_168h_one(
    env: WorkflowEnvironment,
) -> None:
    client = env.client
    queue = f"deadline-{uuid.uuid4().hex[:8]}"
    route = f"route-{queue}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[RouteSchedulerWorkflow, PacedBatchWorkflow],
        activities=[none_closed],
    ):
        scheduler = await client.start_workflow(
            RouteSchedulerWorkflow.run,
            SchedulerInput(
                route_id=route,
                settings=RouteSettings(max_concurrent_lines=2),
                reconcile_seconds=HOUR,
            ),
            id=scheduler_workflow_id(route),
            task_queue=queue,
        )
        long = await client.start_workflow(
            PacedBatchWorkflow.run,
            PacedBatch(route, "w", lines=200, line_seconds=HOUR, window_seconds=168 * HOUR),
            id=f"batch-long-{queue}",
            task_queue=queue,
        )
        await env.sleep(timedelta(hours=1))  # the 168 h batch runs on both slots meanwhile
        short = await client.start_workflow(
            PacedBatchWorkflow.run,
            PacedBatch(route, "w", lines=30, line_seconds=HOUR, window_seconds=24 * HOUR),
            id=f"batch-short-{queue}",
            task_queue=queue,
        )
        short_outcome: PacedOutcome = await short.result()
        long_outcome: PacedOutcome = await long.result()
        save_as = os.environ.get("BACKFILL_RECORD_HISTORIES")  # set by record_histories.py
        if save_as:
            # the scheduler's first run: the 24 h batch arrived in it (it may continue as new)
            history = await scheduler.fetch_history()
            marker = patch_marker(DEADLINE_AWARE_SHARES)
            require(history, E.EVENT_TYPE_MARKER_RECORDED, "deadline-aware marker", marker)
            with (Path(__file__).parent / "histories" / save_as).open("x") as f:  # never overwrite
                f.write(history.to_json())
        await terminate_if_running(client, scheduler.id)  # it may have continued as new

    assert (short_outcome.finished, short_outcome.completed) == (30, True), short_outcome
    assert (long_outcome.finished, long_outcome.completed) == (200, True), long_outcome
    # on arrival the 24 h batch was given both slots (its fair one would take 30 h), then,
    # once 1 slot was enough for what was left, only what it needed
    assert short_outcome.allotments[0][1] == 2, short_outcome.allotments
