"""A batch continues as new when Temporal suggests it, or when its history reaches
`workflows.run_length`'s safety net, and not after a fixed number of lines any more.

On the real dev server (the time-skipping server makes no suggestions): the worker runs the real
workflows and activities with `run_line` replaced by the harness's instant fake (tests/workflows/
test_expiry.py), the route's cap is 1, so each line costs about seven history events."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from activities.control import ControlActivities
from activities.finalizing import FinalizeActivities
from activities.validation import ValidationActivities
from activities.webhooks import WebhookActivities
from backfill.batches.batch import Batch
from backfill.platform.messages import BatchInput
from tests.conftest import TemporalServer
from tests.workflows.test_expiry import Harness, harness_worker
from tools.dev.devserver import DevServer, connect_client, free_port
from workflows import patches, run_length
from workflows.batch import BatchWorkflow
from workflows.scheduler import RouteSchedulerWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")

SUGGEST_AT = 150
"""`limit.historyCount.suggestContinueAsNew` of this module's own dev server."""
DRAIN_EVENTS = 40
"""Events a run may add after it was told to continue: the running line's end, the demand
report and the continue-as-new itself (cap 1)."""
FIXED_LINE_COUNT_HISTORIES = sorted(
    (Path(__file__).parent / "histories" / "lines_per_run_20").glob("*.json")
)
"""Recorded with the code from before `CONTINUE_AS_NEW_BY_HISTORY` (commit 412f725), its
`LINES_PER_RUN` lowered to 20 and the workflow unsandboxed so the lowered value applied: a
30-line batch whose first run drained after 20 lines with no suggestion from the server."""


@pytest_asyncio.fixture(loop_scope="session")
async def suggesting_client(tmp_path: Path) -> AsyncIterator[Client]:
    """A dev server of this test's own that suggests continue-as-new at `SUGGEST_AT` events."""
    server = DevServer(
        tmp_path / "temporal",
        port=free_port(),
        ui_port=None,
        dynamic_config={"limit.historyCount.suggestContinueAsNew": SUGGEST_AT},
    )
    server.start()
    try:
        await server.wait_ready_async(timeout=60)
        yield await connect_client(server.address, server.namespace)
    finally:
        await asyncio.to_thread(server.stop)


async def start(h: Harness, n: int) -> WorkflowHandle[BatchWorkflow, Batch]:
    file_id = h.upload(n)
    batch_id = f"batch_{uuid.uuid4().hex}"
    return await h.client.start_workflow(
        BatchWorkflow.run,
        BatchInput(
            batch_id=batch_id,
            workspace="w",
            input_file_id=file_id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            created_at=int((await h.env.get_current_time()).timestamp()),
        ),
        id=batch_id,
        task_queue=h.settings.task_queue,
    )


async def events_per_run(client: Client, handle: WorkflowHandle[BatchWorkflow, Batch]) -> list[int]:
    """The event count of every run, following the continue-as-new chain from the first."""
    counts = []
    run_id = handle.first_execution_run_id
    while True:
        history = await client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        counts.append(len(history.events))
        last = history.events[-1]
        if last.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            return counts
        run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id


def output_ids(h: Harness, batch: Batch) -> list[str]:
    assert batch.output_file_id is not None
    text = h.store.read_file(batch.output_file_id).decode()
    return [json.loads(line)["custom_id"] for line in text.splitlines()]


async def run_batch(h: Harness, n: int) -> tuple[Batch, list[int]]:
    handle = await start(h, n)
    batch = await asyncio.wait_for(handle.result(), 180)
    assert batch.status == "completed", batch
    assert batch.request_counts.completed == n
    assert output_ids(h, batch) == [f"c{i}" for i in range(n)]
    return batch, await events_per_run(h.client, handle)


async def test_a_batch_continues_as_new_when_temporal_suggests_it(
    suggesting_client: Client, tmp_path: Path
) -> None:
    h = Harness(WorkflowEnvironment.from_client(suggesting_client), tmp_path)
    async with harness_worker(h, h.run_line):
        _, runs = await run_batch(h, 60)
    assert len(runs) >= 3, runs
    for events in runs[:-1]:
        assert SUGGEST_AT <= events <= SUGGEST_AT + DRAIN_EVENTS, runs


def unsandboxed_worker(h: Harness) -> Worker:
    """The harness's worker without the sandbox, so a module constant lowered by the test
    applies inside the workflow (the sandbox would re-import the workflow's modules)."""
    control = ControlActivities(h.settings, h.client)
    return Worker(
        h.client,
        task_queue=h.settings.task_queue,
        workflows=[BatchWorkflow, RouteSchedulerWorkflow],
        activities=[
            ValidationActivities(h.settings, h.store).validate_input,
            h.run_line,
            FinalizeActivities(h.store).finalize_batch,
            control.report_demand,
            control.find_closed_batches,
            # a batch's end announces its webhook event: no endpoint here, nothing is started
            WebhookActivities(h.settings, h.client).announce_webhook_event,
        ],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )


async def test_without_a_suggestion_the_safety_net_continues_a_long_run(
    dev_server: TemporalServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session's dev server suggests at its default (thousands of events): only the
    lowered `MAX_RUN_EVENTS` can make this batch continue."""
    monkeypatch.setattr(run_length, "MAX_RUN_EVENTS", 120)
    h = Harness(WorkflowEnvironment.from_client(await dev_server.client()), tmp_path)
    async with unsandboxed_worker(h):
        _, runs = await run_batch(h, 50)
    assert len(runs) >= 3, runs
    for events in runs[:-1]:
        assert 120 <= events <= 120 + DRAIN_EVENTS, runs


async def test_a_run_no_longer_ends_after_a_fixed_number_of_lines(
    dev_server: TemporalServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `LINES_PER_RUN` at 20, the code from before the patch ran this batch in two runs
    (the recorded histories below); now it is one."""
    monkeypatch.setattr(patches, "LINES_PER_RUN", 20)
    h = Harness(WorkflowEnvironment.from_client(await dev_server.client()), tmp_path)
    async with unsandboxed_worker(h):
        _, runs = await run_batch(h, 30)
    assert len(runs) == 1, runs


async def test_the_histories_of_a_fixed_line_count_exist() -> None:
    assert [p.name for p in FIXED_LINE_COUNT_HISTORIES] == [
        "batch_lines_per_run_20.run01.v1.json",
        "batch_lines_per_run_20.run02.v1.json",
    ]


@pytest.mark.parametrize("path", FIXED_LINE_COUNT_HISTORIES, ids=lambda p: p.stem)
async def test_runs_that_ended_after_a_fixed_number_of_lines_still_replay(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(patches, "LINES_PER_RUN", 20)  # as when they were recorded
    replayer = Replayer(
        workflows=[BatchWorkflow, RouteSchedulerWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    await replayer.replay_workflow(WorkflowHistory.from_json(path.stem, path.read_text()))
