"""Completion windows on the time-skipping test server: batches expire exactly at
`expires_at` with partial results; lines waiting days for a slot do not expire early.

The worker runs the real workflows and the real control activities (scheduler registration);
`run_line` is replaced by name with a fake that commits a real result record instantly, except
for one line held until the test releases it (time does not skip while an activity runs)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.control import ControlActivities
from activities.finalizing import FinalizeActivities
from activities.validation import ValidationActivities
from activities.webhooks import WebhookActivities
from backfill.batches.records import END_MESSAGES
from backfill.files import FileStore
from backfill.platform.config import Settings
from backfill.platform.ids import scheduler_workflow_id
from backfill.platform.messages import (
    BatchInput,
    DemandInput,
    LineInput,
    LineOutcome,
    PauseRequest,
    SchedulerInput,
)
from backfill.routes.scheduler_client import signal_demand
from backfill.routes.settings import RouteSettings
from tests.workflows.holder import SlotHolderWorkflow
from tools.dev.devserver import test_server_path
from workflows.batch import BatchWorkflow
from workflows.scheduler import RouteSchedulerWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Harness:
    def __init__(
        self, env: WorkflowEnvironment, tmp: Path, base_url: str = "http://127.0.0.1:9/v1"
    ) -> None:
        self.env = env
        self.client: Client = env.client
        self.route = f"r-{uuid.uuid4().hex[:6]}"
        self.settings = Settings(
            data_dir=tmp / "data",
            task_queue=f"tq-{uuid.uuid4().hex[:6]}",
            scheduler_reconcile_seconds=6 * 3600,
            models=[
                {
                    "id": "demo",
                    "routes": [
                        {
                            "id": self.route,
                            "base_url": base_url,
                            "max_concurrent_lines": 1,
                        }
                    ],
                }
            ],
        )
        self.store = FileStore(self.settings.data_dir)
        self.hold_position: int | None = None
        self.starts: list[datetime] = []
        """When each line attempt was scheduled (workflow time)."""
        self.release = asyncio.Event()
        self.held = asyncio.Event()

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

    @activity.defn(name="run_line")
    async def run_line(self, input: LineInput) -> LineOutcome:
        self.starts.append(activity.info().current_attempt_scheduled_time)
        if input.position == self.hold_position:
            self.held.set()
            await self.release.wait()
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


async def time_skipping_env() -> WorkflowEnvironment:
    return await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(test_server_path()),
        data_converter=pydantic_data_converter,
    )


@contextlib.asynccontextmanager
async def harness_worker(
    h: Harness,
    run_line: Callable[..., Any],
    workflows: Sequence[type] = (),
    finalize_batch: Callable[..., Any] | None = None,
) -> AsyncIterator[Worker]:
    """A worker on the harness's task queue: the real workflows and activities, with
    `run_line` in place of the line activity (registered by name), and `finalize_batch` in
    place of finalizing's when given."""
    control = ControlActivities(h.settings, h.client)
    async with Worker(
        h.client,
        task_queue=h.settings.task_queue,
        workflows=[BatchWorkflow, RouteSchedulerWorkflow, *workflows],
        activities=[
            ValidationActivities(h.settings, h.store).validate_input,
            run_line,
            finalize_batch or FinalizeActivities(h.store).finalize_batch,
            control.report_demand,
            control.find_closed_batches,
            # a batch's end announces its webhook event: no endpoint here, nothing is started
            WebhookActivities(h.settings, h.client).announce_webhook_event,
        ],
    ) as worker:
        yield worker


@pytest_asyncio.fixture(loop_scope="session")
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    env = await time_skipping_env()
    h = Harness(env, tmp_path)
    async with harness_worker(h, h.run_line, [SlotHolderWorkflow]):
        try:
            yield h
        finally:
            h.release.set()
    await env.shutdown()


async def start_scheduler(
    h: Harness, settings: RouteSettings
) -> WorkflowHandle[RouteSchedulerWorkflow, None]:
    """The route's scheduler, started with `settings`: the time-skipping server does not skip
    time after a workflow update, so a test of a gate's timing starts it with the gate set (the
    api's PUT path is covered on the dev server)."""
    return await h.client.start_workflow(
        RouteSchedulerWorkflow.run,
        SchedulerInput(
            route_id=h.route,
            settings=settings,
            reconcile_seconds=h.settings.scheduler_reconcile_seconds,
        ),
        id=scheduler_workflow_id(h.route),
        task_queue=h.settings.task_queue,
    )


async def start_batch(h: Harness, n: int, window: str) -> tuple[str, int]:
    file_id = h.upload(n)
    batch_id = f"batch_{uuid.uuid4().hex}"
    created = int((await h.env.get_current_time()).timestamp())
    await h.client.start_workflow(
        BatchWorkflow.run,
        BatchInput(
            batch_id=batch_id,
            workspace="w",
            input_file_id=file_id,
            endpoint="/v1/chat/completions",
            completion_window=window,
            created_at=created,
        ),
        id=batch_id,
        task_queue=h.settings.task_queue,
    )
    return batch_id, created


async def error_records(h: Harness, file_id: str | None) -> list[dict[str, object]]:
    assert file_id is not None
    text = h.store.read_file(file_id).decode()
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("window,hours", [("24h", 24), ("168h", 168)])
async def test_batch_expires_with_partial_results(
    harness: Harness, window: str, hours: int
) -> None:
    h = harness
    h.hold_position, h.release, h.held = 3, asyncio.Event(), asyncio.Event()
    batch_id, created = await start_batch(h, 10, window)
    handle = h.client.get_workflow_handle_for(BatchWorkflow.run, batch_id)
    await asyncio.wait_for(h.held.wait(), 60)  # lines 0-2 done, line 3 running
    await handle.signal(BatchWorkflow.pause, PauseRequest(by="test"))
    h.release.set()  # the running line finishes; nothing new starts while paused
    await h.env.sleep(timedelta(hours=hours, minutes=1))  # skip past the window's end
    batch = await asyncio.wait_for(handle.result(), 120)
    assert batch.status == "expired"
    assert batch.expires_at == created + hours * 3600
    assert batch.expired_at == batch.expires_at
    assert batch.request_counts.total == 10
    assert batch.request_counts.completed == 4 and batch.request_counts.failed == 6
    assert batch.output_file_id is not None
    out = h.store.read_file(batch.output_file_id).decode().splitlines()
    assert sorted(json.loads(x)["custom_id"] for x in out) == ["c0", "c1", "c2", "c3"]
    errors = await error_records(h, batch.error_file_id)
    assert [e["custom_id"] for e in errors] == [f"c{i}" for i in range(4, 10)]
    for e in errors:
        assert e["response"] is None
        assert e["error"] == {"code": "batch_expired", "message": END_MESSAGES["batch_expired"]}
    assert batch.usage.total_tokens == 0  # never-run lines cost nothing
    save_as = os.environ.get("BACKFILL_RECORD_HISTORIES")  # set by record_histories.py
    if save_as and window == "24h":
        history = await handle.fetch_history()
        with (Path(__file__).parent / "histories" / save_as).open("x") as f:  # never overwrite
            f.write(history.to_json())


async def test_lines_waiting_days_for_a_slot_expire_exactly_at_expires_at(
    harness: Harness,
) -> None:
    h = harness
    h.hold_position = None
    holder = f"batch_holder{uuid.uuid4().hex[:8]}"
    await h.client.start_workflow(
        SlotHolderWorkflow.run, id=holder, task_queue=h.settings.task_queue
    )
    await signal_demand(
        h.client,
        h.settings,
        DemandInput(route_id=h.route, batch_id=holder, workspace="other", wanted=1),
    )
    batch_id, created = await start_batch(h, 5, "72h")
    handle = h.client.get_workflow_handle_for(BatchWorkflow.run, batch_id)
    for _ in range(71 // 5):  # days pass, five hours at a time (the holder never lets go)
        await h.env.sleep(timedelta(hours=5))
    await h.env.sleep(timedelta(hours=71 % 5))
    await h.env.sleep(timedelta(minutes=59))
    b = await handle.query(BatchWorkflow.describe)
    assert b.status == "in_progress" and b.expired_at is None
    assert b.request_counts.completed == 0
    assert b.backfill.summary == "Queued — waiting for capacity"
    await h.env.sleep(timedelta(minutes=2))
    batch = await asyncio.wait_for(handle.result(), 120)
    assert batch.status == "expired"
    assert batch.expired_at == batch.expires_at == created + 72 * 3600
    errors = await error_records(h, batch.error_file_id)
    assert [e["error"]["code"] for e in errors] == ["batch_expired"] * 5  # type: ignore[index]
    assert batch.output_file_id is None
