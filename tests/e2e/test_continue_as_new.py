"""Continue-as-new of the scheduler and of batches loses no demand, allotment, setting or line.

Runs on its own dev server with `limit.historyCount.suggestContinueAsNew` lowered so every
workflow continues-as-new many times within seconds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowExecutionStatus

from backfill.batches.lifecycle import SUMMARY_MEMO
from backfill.platform.ids import scheduler_workflow_id
from tests.e2e.stack import Stack, input_ids, output_ids, submit, wait_terminal
from tests.polling import poll_until
from tools.dev.devserver import DevServer, connect_client, free_port
from tools.sim import SimConfig


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def can_server_stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    """The module's dev server and stack; each test leases its own workspaces (`can_stack`)."""
    tmp = tmp_path_factory.mktemp("continue-as-new")
    server = DevServer(
        tmp / "temporal",
        port=free_port(),
        ui_port=None,
        dynamic_config={"limit.historyCount.suggestContinueAsNew": 60},
    )
    server.start()
    try:
        await server.wait_ready_async(timeout=60)
        s = Stack(
            tmp, server.address, cap=3, sim=SimConfig(model_names=[], latency_ms=30), tenants=4
        )
        async with s.running():
            yield s
    finally:
        await asyncio.to_thread(server.stop)


@pytest_asyncio.fixture(loop_scope="session")
async def can_stack(can_server_stack: Stack) -> AsyncIterator[Stack]:
    leased = can_server_stack.lease()
    try:
        yield leased
    finally:
        await leased.stop()


async def scheduler_runs(stack: Stack) -> int:
    temporal = await connect_client(stack.temporal_address)
    query = f"WorkflowId = '{scheduler_workflow_id(stack.route_id)}'"
    return len([ex async for ex in temporal.list_workflows(query)])


async def test_continue_as_new_loses_nothing(can_stack: Stack) -> None:
    stack = can_stack
    url = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
    admin = stack.auth("sk-test-admin")
    runs_before = await scheduler_runs(stack)  # the other test may have run on this route
    async with httpx.AsyncClient(headers=admin) as http:
        # A setting that differs from the config: it must live in the scheduler's state.
        assert (await http.put(url, json={"max_concurrent_lines": 2})).status_code == 200
    sizes = {"sk-test-alpha": 80, "sk-test-beta": 60, "sk-test-gamma": 40}
    batches = {key: await submit(stack, n, key=key, prefix=key[-5:]) for key, n in sizes.items()}
    for key, batch_id in batches.items():
        client = stack.client(key)
        batch = await wait_terminal(client, batch_id, within=240)
        assert batch.status == "completed", batch
        ids, errors = await output_ids(client, batch)
        assert errors == []
        assert ids == input_ids(key[-5:], sizes[key])
        assert batch.request_counts.completed == sizes[key]
    assert stack.sim.app.stats_dict()["batch"]["peak_concurrent"] <= 2
    temporal = await connect_client(stack.temporal_address)
    assert await scheduler_runs(stack) > max(runs_before, 1), "the scheduler never continued"
    batch_runs = [
        ex async for ex in temporal.list_workflows(f"WorkflowId = '{batches['sk-test-alpha']}'")
    ]
    assert len(batch_runs) > 1, "the batch never continued as new"
    async with httpx.AsyncClient(headers=admin) as http:
        doc = (await http.get(url)).json()
    assert doc["settings"]["max_concurrent_lines"] == 2
    assert doc["status"]["batches"] == []  # every batch left; nothing leaked


async def test_a_workspaces_batches_are_found_by_search_attributes_with_details_after_can(
    can_stack: Stack,
) -> None:
    """The operator's view in the Temporal UI: a visibility query on the search attributes
    finds a workspace's in-progress batch, and after it continued as new its run still shows
    its summary (carried in the memo) and current details (status, progress, routes)."""
    stack = can_stack
    workspace = stack.workspaces["alpha"]
    batch_id = await submit(stack, 400, prefix="ui")
    await submit(stack, 5, key="sk-test-beta", prefix="other")  # another workspace's batch
    temporal = await connect_client(stack.temporal_address)

    async def runs() -> list[Any]:
        return [ex async for ex in temporal.list_workflows(f"WorkflowId = '{batch_id}'")]

    await poll_until(runs, lambda r: len(r) > 1, timeout=120, what="the batch continuing as new")
    async with httpx.AsyncClient(headers=stack.auth()) as http:
        resp = await http.post(f"{stack.api_url}/v1/batches/{batch_id}/pause")
        assert resp.status_code == 200, resp.text

    query = (
        f"BackfillWorkspace = '{workspace}' AND ExecutionStatus = 'Running' "
        "AND WorkflowType = 'BatchWorkflow'"
    )
    found = await poll_until(
        lambda: _ids(temporal, query),
        lambda ids: ids == [batch_id],
        timeout=30,
        what=f"visibility listing {batch_id} alone for {workspace}",
    )
    assert found == [batch_id]

    handle = temporal.get_workflow_handle(batch_id)
    desc = await handle.describe()
    first = [ex for ex in await runs() if ex.status == WorkflowExecutionStatus.CONTINUED_AS_NEW]
    assert first and desc.run_id not in {ex.run_id for ex in first}  # a continued run
    assert await desc.memo_value(SUMMARY_MEMO, type_hint=str) == (
        f"/v1/chat/completions batch of in.jsonl ({workspace})"
    )

    async def details() -> str:
        meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        return meta.current_details

    shown = await poll_until(
        details, lambda d: "paused" in d, timeout=30, what="the paused batch's current details"
    )
    assert shown.startswith(f"/v1/chat/completions batch of in.jsonl ({workspace})\n"), shown
    assert "**in_progress** · paused by alpha-key" in shown, shown
    assert f"- {stack.route_id} (demo): paused" in shown, shown
    assert "/400 lines finished" in shown, shown


async def _ids(temporal: Any, query: str) -> list[str]:
    return sorted([ex.id async for ex in temporal.list_workflows(query)])
