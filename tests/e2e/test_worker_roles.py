"""Worker roles (`BACKFILL_WORKER_ROLE`): a workflows-only worker and an activities-only worker
on the same task queue run a batch between them, each doing only its own part; a workflows-only
worker alone runs the batch's workflow but sends no line."""

from __future__ import annotations

import httpx
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client

from tests.e2e.conftest import MakeStack
from tests.e2e.stack import input_ids, output_ids, submit, wait_terminal
from tests.e2e.test_metrics import scrape, value, worker_url
from tests.polling import poll_until
from tools.sim import SimConfig

LINES = 30


async def test_workflows_and_activities_in_separate_workers(
    make_stack: MakeStack, temporal_client: Client
) -> None:
    stack = await make_stack(workers=0, cap=4, sim=SimConfig(model_names=[], latency_ms=50))
    flows = stack.start_worker({"BACKFILL_WORKER_ROLE": "workflows"})
    await stack.wait_polled()  # its answer admits the batch (decision 0027)
    client = stack.client()
    batch_id = await submit(stack, LINES, prefix="role")

    # The workflows-only worker runs the batch's workflow (it scheduled the validation), but no
    # worker takes the activity: it waits in the task queue and nothing reaches the upstream.
    async def validation_waiting() -> bool:
        desc = await temporal_client.get_workflow_handle(batch_id).describe()
        return any(
            p.activity_type.name == "validate_input"
            and p.state == PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED
            for p in desc.raw_description.pending_activities
        )

    await poll_until(validation_waiting, timeout=60, what="validation scheduled, not started")
    assert (await client.batches.retrieve(batch_id)).status == "validating"
    assert stack.sim.app.stats_dict()["batch"]["by_batch"].get(batch_id, 0) == 0

    lines = stack.start_worker({"BACKFILL_WORKER_ROLE": "activities"})
    batch = await wait_terminal(client, batch_id, within=180)
    assert batch.status == "completed", batch
    ids, errors = await output_ids(client, batch)
    assert ids == input_ids("role", LINES) and errors == []

    # Each worker did only its own part: every workflow task of the batch was run by the
    # workflows worker, every activity (validation, lines, demand reports, finalizing) by the
    # activities worker; the line counters are the activities worker's alone.
    wft, act = set(), set()
    async for ev in temporal_client.get_workflow_handle(batch_id).fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            wft.add(ev.workflow_task_started_event_attributes.identity)
        elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            act.add(ev.activity_task_started_event_attributes.identity)
    assert {i.split("@")[0] for i in wft} == {str(flows.pid)}, wft
    assert {i.split("@")[0] for i in act} == {str(lines.pid)}, act
    async with httpx.AsyncClient(timeout=30) as http:
        by_worker = [await scrape(http, worker_url(stack, i)) for i in range(2)]
    name, labels = "gateway_batch_line_outcomes_total", {"provider": stack.route_id}
    assert value(by_worker[0], name, outcome="2xx", **labels) is None
    assert value(by_worker[1], name, outcome="2xx", **labels) == LINES
