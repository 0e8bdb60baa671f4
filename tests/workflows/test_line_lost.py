"""A line whose activity is lost again and again (its worker dies, or the activity crashes) is
requeued each time, and after MAX_LOST_ATTEMPTS losses ends as `line_lost` in the error file,
written by the real line activity without sending it again. On the time-skipping server, with
the real workflows and the real validation, finalizing and line activities; only the losses are
made up (`run_line` raises for one line until the workflow gives up on it)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from temporalio import activity

from activities.lines.run_line import LineActivities
from backfill.platform.messages import LineInput, LineOutcome
from tests.workflows.test_expiry import Harness, harness_worker, start_batch, time_skipping_env
from tools.sim import SimServer
from workflows.batch import BatchWorkflow
from workflows.line_activity import MAX_LOST_ATTEMPTS

pytestmark = pytest.mark.asyncio(loop_scope="session")

LOST_LINE = 2


class Losing:
    """`run_line` that loses line LOST_LINE every time it is really sent, and otherwise runs the
    real activity against a simulator."""

    def __init__(self, real: LineActivities) -> None:
        self.real = real
        self.losses = 0
        self.give_ups: list[LineInput] = []

    @activity.defn(name="run_line")
    async def run_line(self, input: LineInput) -> LineOutcome:
        if input.position == LOST_LINE:
            if input.give_up_code is None:
                self.losses += 1
                raise RuntimeError("the worker running this line died")
            self.give_ups.append(input)
        return await self.real.run_line(input)


@pytest_asyncio.fixture(loop_scope="session")
async def losing(tmp_path: Path) -> AsyncIterator[tuple[Harness, Losing, SimServer]]:
    env = await time_skipping_env()
    async with SimServer() as sim:
        h = Harness(env, tmp_path, base_url=sim.base_url)
        async with httpx.AsyncClient() as http:
            lose = Losing(LineActivities(h.settings, h.store, http))
            async with harness_worker(h, lose.run_line):
                yield h, lose, sim
    await env.shutdown()


async def test_a_line_lost_again_and_again_ends_as_line_lost(
    losing: tuple[Harness, Losing, SimServer],
) -> None:
    h, lose, sim = losing
    batch_id, _ = await start_batch(h, 5, "24h")
    handle = h.client.get_workflow_handle_for(BatchWorkflow.run, batch_id)
    batch = await asyncio.wait_for(handle.result(), 120)
    assert batch.status == "completed"
    assert batch.request_counts.completed == 4 and batch.request_counts.failed == 1
    assert lose.losses == MAX_LOST_ATTEMPTS
    assert len(lose.give_ups) == 1 and lose.give_ups[0].give_up_code == "line_lost"
    assert batch.error_file_id is not None
    errors = [json.loads(x) for x in h.store.read_file(batch.error_file_id).decode().splitlines()]
    assert [e["custom_id"] for e in errors] == [f"c{LOST_LINE}"]
    assert errors[0]["response"] is None and errors[0]["error"]["code"] == "line_lost"
    assert f"lost {MAX_LOST_ATTEMPTS} times" in errors[0]["error"]["message"]
    # The given-up line was not sent again; the four others were sent once each.
    assert sim.app.stats_dict()["batch"]["by_batch"] == {batch_id: 4}
