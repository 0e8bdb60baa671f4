"""A batch's final `request_counts` and `usage` come from its committed records, once per line,
whatever the workflow saw: a line whose worker died after committing it is counted once, and a
line committed by a worker the workflow heard nothing from before the batch ended is counted too.

The workflow's own tallies only show progress meanwhile (`backfill.batches.lifecycle.tally_line`);
finalizing counts the records and its numbers replace them (`BatchWorkflow._finish`). On the
time-skipping server with the real workflows and the real validation and finalizing; `run_line`
is replaced by a fake that commits a real record (first writer wins, as the real activity's
commit) and answers what the store kept."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio import activity

from backfill.batches.records import outcome_from_record
from backfill.platform.messages import LineInput, LineOutcome
from tests.workflows.test_expiry import Harness, harness_worker, start_batch, time_skipping_env
from workflows.batch import BatchWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")

DYING_LINE = 1
USAGE = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


class DiesAfterCommitting:
    """`run_line` whose first run of line DYING_LINE commits the line's record and then dies
    before answering (a worker killed between its commit and its reply); `hold` keeps that run
    waiting, committed, until the test releases it."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.commits: list[int] = []
        self.deaths = 0
        self.hold = False
        self.committed = asyncio.Event()
        self.release = asyncio.Event()

    @activity.defn(name="run_line")
    async def run_line(self, input: LineInput) -> LineOutcome:
        store = self.h.store
        line_no = store.line_number(input.batch_id, input.route_index, input.position)
        raw = store.read_line(input.batch_id, input.input_file_id, line_no)
        record = {
            "id": f"batch_req_{line_no}",
            "custom_id": json.loads(raw)["custom_id"],
            "response": {"status_code": 200, "request_id": "r", "body": {"usage": USAGE}},
            "error": None,
        }
        kept, _ = store.commit_result(input.batch_id, line_no, json.dumps(record).encode())
        self.commits.append(line_no)
        if input.position == DYING_LINE and self.deaths == 0:
            self.deaths += 1
            self.committed.set()
            if self.hold:
                await self.release.wait()
            raise RuntimeError("the worker died after committing the line")
        return outcome_from_record(line_no, kept)


@pytest_asyncio.fixture(loop_scope="session")
async def dying(tmp_path: Path) -> AsyncIterator[tuple[Harness, DiesAfterCommitting]]:
    env = await time_skipping_env()
    h = Harness(env, tmp_path)
    fake = DiesAfterCommitting(h)
    async with harness_worker(h, fake.run_line):
        try:
            yield h, fake
        finally:
            fake.release.set()
    await env.shutdown()


async def output_ids(h: Harness, file_id: str | None) -> list[str]:
    assert file_id is not None
    return [json.loads(x)["custom_id"] for x in h.store.read_file(file_id).decode().splitlines()]


async def test_a_line_committed_twice_is_counted_once(
    dying: tuple[Harness, DiesAfterCommitting],
) -> None:
    h, fake = dying
    batch_id, _ = await start_batch(h, 4, "24h")
    handle = h.client.get_workflow_handle_for(BatchWorkflow.run, batch_id)
    batch = await asyncio.wait_for(handle.result(), 120)
    assert fake.deaths == 1
    assert sorted(fake.commits) == [0, 1, 1, 2, 3]  # line 1 was committed by two runs
    assert batch.status == "completed"
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (4, 4, 0)
    assert batch.usage.total_tokens == 4 * 7 and batch.usage.input_tokens == 4 * 3
    assert await output_ids(h, batch.output_file_id) == ["c0", "c1", "c2", "c3"]
    assert batch.error_file_id is None


async def test_the_records_not_the_tallies_make_the_final_counts(
    dying: tuple[Harness, DiesAfterCommitting],
) -> None:
    """Line 1 commits, then its worker hangs; the batch is cancelled, so the line is never run
    again and the workflow never counts it. Its record is in the store: the final object
    counts it completed, as the output file holds it."""
    h, fake = dying
    fake.hold = True
    batch_id, _ = await start_batch(h, 3, "24h")
    handle = h.client.get_workflow_handle_for(BatchWorkflow.run, batch_id)
    await asyncio.wait_for(fake.committed.wait(), 60)
    cancelling = await handle.execute_update(BatchWorkflow.cancel_now)
    assert cancelling.status == "cancelling"
    assert cancelling.request_counts.completed == 1  # the workflow's tally: line 0 only
    fake.release.set()
    batch = await asyncio.wait_for(handle.result(), 120)
    assert fake.commits == [0, 1]  # line 1 ran once and line 2 never
    assert batch.status == "cancelled"
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (3, 2, 1)
    assert batch.usage.total_tokens == 2 * 7
    assert await output_ids(h, batch.output_file_id) == ["c0", "c1"]
    assert await output_ids(h, batch.error_file_id) == ["c2"]  # batch_cancelled
