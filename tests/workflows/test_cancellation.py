"""A Temporal cancellation request (UI "Request Cancellation", `temporal workflow cancel`) that
lands while the batch awaits an activity still ends the batch with its files and leaves the
route's scheduler (docs/decisions/0008).

Real dev server, real workflows and real validation/finalize/control activities; each activity
the test needs to pause is replaced by name with one that waits on an event the test controls,
then does the real work. `run_line` commits a real result record at once."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from activities.control import ControlActivities
from activities.finalizing import FinalizeActivities
from activities.validation import ValidationActivities
from activities.webhooks import WebhookActivities
from backfill.batches.batch import Batch
from backfill.batches.records import END_MESSAGES
from backfill.files import FileStore
from backfill.platform.config import Settings
from backfill.platform.ids import scheduler_workflow_id
from backfill.platform.messages import (
    BatchInput,
    ClosedBatchesInput,
    ClosedBatchesOutput,
    DemandInput,
    FinalizeInput,
    FinalizeOutput,
    LineInput,
    LineOutcome,
    ValidateInput,
    ValidateOutput,
)
from tests.conftest import TemporalServer
from workflows.batch import BatchWorkflow
from workflows.scheduler import RouteSchedulerWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")

HISTORIES = Path(__file__).parent / "histories"


class Gate:
    """A pause point: `hold` makes the next call wait until `release`."""

    def __init__(self, when: Callable[[Any], bool] = lambda _: True) -> None:
        self.when = when
        self.armed = False
        self.entered = asyncio.Event()
        self.released = asyncio.Event()

    def hold(self) -> None:
        self.armed = True

    async def pass_(self, input: Any) -> None:
        if self.armed and self.when(input):
            self.armed = False
            self.entered.set()
            await self.released.wait()


class Harness:
    def __init__(self, client: Client, tmp: Path) -> None:
        self.client = client
        self.route = f"r-{uuid.uuid4().hex[:6]}"
        self.settings = Settings(
            data_dir=tmp / "data",
            task_queue=f"tq-{uuid.uuid4().hex[:6]}",
            models=[
                {
                    "id": "demo",
                    "routes": [
                        {
                            "id": self.route,
                            "base_url": "http://127.0.0.1:9/v1",
                            "max_concurrent_lines": 2,
                        }
                    ],
                }
            ],
        )
        self.store = FileStore(self.settings.data_dir)
        self.validation = ValidationActivities(self.settings, self.store)
        self.finalizing = FinalizeActivities(self.store)
        self.control = ControlActivities(self.settings, client)
        self.validate_gate = Gate()
        self.demand_gate = Gate()
        self.finalize_gate = Gate()
        self.demands: list[DemandInput] = []
        self.hold_lines_from: int | None = None
        """Lines at this position and later wait for `lines_go`."""
        self.lines_go = asyncio.Event()

    def upload(self, n: int) -> str:
        up = self.store.begin_upload(1 << 30)
        for i in range(n):
            line = {
                "custom_id": f"c{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "demo", "messages": [{"role": "user", "content": "x"}]},
            }
            up.write(json.dumps(line).encode() + b"\n")
        return up.finish(workspace="w", filename="in.jsonl", purpose="batch").id

    @activity.defn(name="validate_input")
    async def validate_input(self, input: ValidateInput) -> ValidateOutput:
        await self.validate_gate.pass_(input)
        return await self.validation.validate_input(input)

    @activity.defn(name="report_demand")
    async def report_demand(self, input: DemandInput) -> None:
        await self.demand_gate.pass_(input)
        self.demands.append(input)
        await self.control.report_demand(input)

    @activity.defn(name="find_closed_batches")
    async def find_closed_batches(self, input: ClosedBatchesInput) -> ClosedBatchesOutput:
        return await self.control.find_closed_batches(input)

    @activity.defn(name="finalize_batch")
    async def finalize_batch(self, input: FinalizeInput) -> FinalizeOutput:
        await self.finalize_gate.pass_(input)
        return await self.finalizing.finalize_batch(input)

    @activity.defn(name="run_line")
    async def run_line(self, input: LineInput) -> LineOutcome:
        if self.hold_lines_from is not None and input.position >= self.hold_lines_from:
            await self.lines_go.wait()
        line_no = self.store.line_number(input.batch_id, input.route_index, input.position)
        custom_id = json.loads(self.store.read_line(input.batch_id, input.input_file_id, line_no))[
            "custom_id"
        ]
        record = {
            "id": f"batch_req_{line_no}",
            "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": "r", "body": {"usage": {}}},
            "error": None,
        }
        self.store.commit_result(input.batch_id, line_no, json.dumps(record).encode())
        return LineOutcome(line=line_no, ok=True, status_code=200)

    async def start(self, n: int) -> WorkflowHandle[BatchWorkflow, Batch]:
        file_id = self.upload(n)
        batch_id = f"batch_{uuid.uuid4().hex}"
        return await self.client.start_workflow(
            BatchWorkflow.run,
            BatchInput(
                batch_id=batch_id,
                workspace="w",
                input_file_id=file_id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
                created_at=int(time.time()),
            ),
            id=batch_id,
            task_queue=self.settings.task_queue,
        )

    def records(self, file_id: str | None) -> list[dict[str, Any]]:
        if file_id is None:
            return []
        text = self.store.read_file(file_id).decode()
        return [json.loads(line) for line in text.splitlines()]

    async def scheduler_batches(self) -> dict[str, int] | None:
        """{batch id: wanted} in the route's scheduler; None if it never started."""
        handle = self.client.get_workflow_handle_for(
            RouteSchedulerWorkflow.run, scheduler_workflow_id(self.route)
        )
        try:
            status = await handle.query(RouteSchedulerWorkflow.status)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        return {b.batch_id: b.wanted for b in status.batches}


@pytest_asyncio.fixture(loop_scope="session")
async def harness(dev_server: TemporalServer, tmp_path: Path) -> AsyncIterator[Harness]:
    client = await dev_server.client()
    h = Harness(client, tmp_path)
    async with Worker(
        client,
        task_queue=h.settings.task_queue,
        workflows=[BatchWorkflow, RouteSchedulerWorkflow],
        activities=[
            h.validate_input,
            h.run_line,
            h.finalize_batch,
            h.report_demand,
            h.find_closed_batches,
            # a batch's end announces its webhook event: no endpoint here, nothing is started
            WebhookActivities(h.settings, client).announce_webhook_event,
        ],
    ):
        try:
            yield h
        finally:
            for gate in (h.validate_gate, h.demand_gate, h.finalize_gate):
                gate.released.set()
            h.lines_go.set()


async def cancel_at(h: Harness, gate: Gate, handle: WorkflowHandle[Any, Any]) -> None:
    """Wait until the activity behind `gate` runs, request cancellation, let the activity go."""
    await asyncio.wait_for(gate.entered.wait(), 60)
    await handle.cancel()
    # The request is in history before the activity answers (so it lands while it is in flight).
    await wait_for_event(handle, "cancel_requested")
    gate.released.set()


async def wait_for_event(handle: WorkflowHandle[Any, Any], kind: str) -> None:
    for _ in range(600):
        history = await handle.fetch_history()
        if any(e.HasField(f"workflow_execution_{kind}_event_attributes") for e in history.events):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(kind)


async def finished(handle: WorkflowHandle[BatchWorkflow, Batch]) -> Batch:
    batch = await asyncio.wait_for(handle.result(), 60)
    desc = await handle.describe()
    assert desc.status == WorkflowExecutionStatus.COMPLETED  # closed by the batch, with its files
    return batch


async def scheduler_left(h: Harness, batch_id: str) -> None:
    """The route's scheduler holds nothing for the batch (it told the scheduler: wanted 0)."""
    for _ in range(200):
        batches = await h.scheduler_batches()
        if batches is None or batch_id not in batches:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"scheduler still holds {batch_id}: {await h.scheduler_batches()}")


def save_history_if_recording(name: str, history: Any) -> None:
    if os.environ.get("BACKFILL_RECORD_HISTORIES"):
        (HISTORIES / f"{name}.json").write_text(history.to_json())


async def test_cancel_while_validating(harness: Harness) -> None:
    h = harness
    h.validate_gate.hold()
    handle = await h.start(6)
    await cancel_at(h, h.validate_gate, handle)
    batch = await finished(handle)
    assert batch.status == "cancelled" and batch.cancelled_at and batch.cancelling_at
    assert batch.in_progress_at is None
    assert batch.output_file_id is None
    errors = h.records(batch.error_file_id)
    assert sorted(e["custom_id"] for e in errors) == sorted(f"c{i}" for i in range(6))
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert errors[0]["error"]["message"] == END_MESSAGES["batch_cancelled"]
    assert batch.request_counts.total == 6 and batch.request_counts.failed == 6
    assert h.demands == []  # nothing ran, so no scheduler was ever asked
    await scheduler_left(h, batch.id)
    save_history_if_recording("batch_cancel_requested_validating", await handle.fetch_history())


async def test_cancel_while_reporting_demand(harness: Harness) -> None:
    h = harness
    h.demand_gate.hold()  # the first report (wanted 5), before any line has run
    handle = await h.start(5)
    await cancel_at(h, h.demand_gate, handle)
    batch = await finished(handle)
    assert batch.status == "cancelled" and batch.cancelled_at
    errors = h.records(batch.error_file_id)
    assert sorted(e["custom_id"] for e in errors) == sorted(f"c{i}" for i in range(5))
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    ours = [d.wanted for d in h.demands if d.batch_id == batch.id]
    assert ours[0] == 5 and ours[-1] == 0  # registered, then left
    await scheduler_left(h, batch.id)
    save_history_if_recording("batch_cancel_requested_reporting", await handle.fetch_history())


async def test_cancel_with_lines_done_keeps_both_files(harness: Harness) -> None:
    """Cancelled after some lines ran, while demand is reported (the fall after a pause): the
    output file has the lines that ran, the error file the rest."""
    h = harness
    h.hold_lines_from = 3  # lines 0-2 run at once, 3 and 4 (the allotment: 2) wait
    handle = await h.start(40)
    for _ in range(600):
        if (await handle.query(BatchWorkflow.describe)).request_counts.completed >= 3:
            break
        await asyncio.sleep(0.02)
    h.demand_gate.hold()
    await handle.signal(BatchWorkflow.pause)  # nothing new starts; demand falls to what runs
    h.lines_go.set()  # 3 and 4 finish: the fall is reported, and held there
    await cancel_at(h, h.demand_gate, handle)
    batch = await finished(handle)
    assert batch.status == "cancelled"
    done = [r["custom_id"] for r in h.records(batch.output_file_id)]
    errors = h.records(batch.error_file_id)
    assert (
        sorted(done) == [f"c{i}" for i in range(5)]
        and errors
        and {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    )
    assert sorted(done + [e["custom_id"] for e in errors]) == sorted(f"c{i}" for i in range(40))
    assert batch.request_counts.completed == len(done)
    await scheduler_left(h, batch.id)


async def test_cancel_while_finalizing_ends_completed(harness: Harness) -> None:
    """All lines ran: a cancellation that lands while the files are assembled is too late to
    cancel anything, and the batch completes (as a `cancel` signal would leave it)."""
    h = harness
    h.finalize_gate.hold()
    handle = await h.start(4)
    await cancel_at(h, h.finalize_gate, handle)
    batch = await finished(handle)
    assert batch.status == "completed" and batch.completed_at and batch.cancelling_at is None
    assert sorted(r["custom_id"] for r in h.records(batch.output_file_id)) == [
        f"c{i}" for i in range(4)
    ]
    assert batch.error_file_id is None
    await scheduler_left(h, batch.id)
    save_history_if_recording("batch_cancel_requested_finalizing", await handle.fetch_history())
