"""A batch whose finalizing finds the file store unavailable waits until its deadline (24 hours
at least), trying again at most 30 s apart, and then ends `failed` saying why, as a completed
run with its webhook announced; an error that waiting cannot mend fails it at once
(docs/decisions/0047). On the time-skipping server, with `finalize_batch` replaced by name."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.retention import RetentionActivities, drop_ended_work
from backfill.batches.storage_waits import MAX_INTERVAL_SECONDS, MIN_WAIT_SECONDS, STORE_UNAVAILABLE
from backfill.platform.messages import FinalizeInput, FinalizeOutput
from tests.workflows.test_expiry import Harness, harness_worker, start_batch, time_skipping_env
from workflows.batch import BatchWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")

ANY_ID_IS_OLD = (1 << 48) // 1000 + 2 * 3600
"""Seconds after the latest creation time a batch id's 12 hex digits can say, and an hour."""


class Finalizing:
    """A `finalize_batch` that always fails: on an unavailable store, or on a missing input."""

    def __init__(self) -> None:
        self.error_type = STORE_UNAVAILABLE
        self.attempts: list[float] = []
        """When each attempt started (workflow time, Unix seconds)."""

    @activity.defn(name="finalize_batch")
    async def finalize_batch(self, input: FinalizeInput) -> FinalizeOutput:
        self.attempts.append(activity.info().current_attempt_scheduled_time.timestamp())
        raise ApplicationError(
            "store", type=self.error_type, non_retryable=self.error_type != STORE_UNAVAILABLE
        )


@pytest_asyncio.fixture(loop_scope="session")
async def outage(tmp_path: Path) -> AsyncIterator[tuple[Harness, Finalizing]]:
    env = await time_skipping_env()
    h = Harness(env, tmp_path)
    finalizing = Finalizing()
    async with harness_worker(h, h.run_line, finalize_batch=finalizing.finalize_batch):
        yield h, finalizing
    await env.shutdown()


async def test_finalizing_waits_for_the_store_until_the_deadline_then_fails_the_batch(
    outage: tuple[Harness, Finalizing],
) -> None:
    h, finalizing = outage
    batch_id, created = await start_batch(h, 3, "24h")
    handle = h.client.get_workflow_handle_for(BatchWorkflow.run, batch_id)
    await h.env.sleep(timedelta(hours=24, minutes=5))  # skip past the deadline
    batch = await asyncio.wait_for(handle.result(), 300)  # a completed run, not a failed one
    assert batch.status == "failed"
    assert batch.errors is not None
    assert [e.code for e in batch.errors.data] == ["store_unavailable"]
    assert batch.output_file_id is None
    # Tried until the deadline (24 h: the batch's expiry is nearer), never more than 30 s apart.
    first, last = finalizing.attempts[0], finalizing.attempts[-1]
    assert MIN_WAIT_SECONDS - 2 * MAX_INTERVAL_SECONDS <= last - first <= MIN_WAIT_SECONDS
    gaps = [b - a for a, b in zip(finalizing.attempts, finalizing.attempts[1:], strict=False)]
    assert max(gaps) <= MAX_INTERVAL_SECONDS + 1
    assert len(finalizing.attempts) > 24 * 3600 / (MAX_INTERVAL_SECONDS + 1)
    assert batch.failed_at is not None and batch.failed_at >= created + MIN_WAIT_SECONDS - 60


async def test_an_error_waiting_cannot_mend_fails_the_batch_at_once(
    outage: tuple[Harness, Finalizing],
) -> None:
    h, finalizing = outage
    finalizing.error_type = "FileNotFoundError"
    batch_id, _ = await start_batch(h, 3, "24h")
    handle = h.client.get_workflow_handle_for(BatchWorkflow.run, batch_id)
    batch = await asyncio.wait_for(handle.result(), 120)
    assert batch.status == "failed"
    assert batch.errors is not None
    [error] = batch.errors.data
    assert error.code == "store_error" and "FileNotFoundError" in error.message
    assert len(finalizing.attempts) == 1
    # Its work (line index, results) is left to the retention pass, which asks Temporal: the
    # batch's workflow is closed, so the work goes. (Ids here are not timed: any `now` past
    # the latest time an id can say makes every batch old enough.)
    assert h.store.keys(f"batches/{batch_id}/results/")
    retention = RetentionActivities(h.store, h.client)
    assert await drop_ended_work(h.store, retention._closed, now=ANY_ID_IS_OLD) == 1
    assert h.store.keys(f"batches/{batch_id}/") == []
    save_as = os.environ.get("BACKFILL_RECORD_HISTORIES")  # set by record_histories.py
    if save_as:
        history = await handle.fetch_history()
        with (Path(__file__).parent / "histories" / save_as).open("x") as f:  # never overwrite
            f.write(history.to_json())
