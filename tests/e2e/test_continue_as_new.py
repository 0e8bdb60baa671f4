"""Continue-as-new of the scheduler and of batches loses no demand, allotment, setting or line.

Runs on its own dev server with `limit.historyCount.suggestContinueAsNew` lowered so every
workflow continues-as-new many times within seconds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest_asyncio

from backfill.dev.devserver import DevServer, connect_client, free_port
from backfill.ids import scheduler_workflow_id
from backfill.sim import SimConfig
from tests.e2e.stack import Stack, input_ids, output_ids, submit, wait_terminal


@pytest_asyncio.fixture(loop_scope="session")
async def can_stack(tmp_path: Path) -> AsyncIterator[Stack]:
    server = DevServer(
        tmp_path / "temporal",
        port=free_port(),
        ui_port=None,
        dynamic_config={"limit.historyCount.suggestContinueAsNew": 60},
    )
    server.start()
    try:
        await server.wait_ready_async(timeout=60)
        s = Stack(tmp_path, server.address, cap=3, sim=SimConfig(model_names=[], latency_ms=30))
        async with s.running():
            yield s
    finally:
        await asyncio.to_thread(server.stop)


async def test_continue_as_new_loses_nothing(can_stack: Stack) -> None:
    stack = can_stack
    url = f"{stack.api_url}/api/v1/platform/deployments/{stack.route_id}/batch-scheduling"
    admin = {"Authorization": "Bearer sk-test-admin"}
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
    sched_runs = [
        ex
        async for ex in temporal.list_workflows(
            f"WorkflowId = '{scheduler_workflow_id(stack.route_id)}'"
        )
    ]
    assert len(sched_runs) > 1, "the scheduler never continued as new"
    batch_runs = [
        ex async for ex in temporal.list_workflows(f"WorkflowId = '{batches['sk-test-alpha']}'")
    ]
    assert len(batch_runs) > 1, "the batch never continued as new"
    async with httpx.AsyncClient(headers=admin) as http:
        doc = (await http.get(url)).json()
    assert doc["settings"]["max_concurrent_lines"] == 2
    assert doc["status"]["batches"] == []  # every batch left; nothing leaked
