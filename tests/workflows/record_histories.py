"""Record workflow histories for the replay tests (run by hand when a workflow changes on
purpose, after guarding the change with `workflow.patched`):

    .venv/bin/python -m tests.workflows.record_histories

Starts a dev server and the real stack, runs a few batches through the paths that matter
(completed with a pause/resume, cancelled, failed validation, continue-as-new of a batch and of
the scheduler on a server that suggests it early) and saves the histories as JSON under
tests/workflows/histories/. The expiry history comes from the time-skipping test
(tests/workflows/test_expiry.py), which this script runs with BACKFILL_RECORD_HISTORIES=1.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from backfill.dev.devserver import DevServer, connect_client, free_port
from backfill.ids import scheduler_workflow_id
from backfill.sim import SimConfig
from tests.e2e.stack import API_KEY, Stack, jsonl, submit, wait_terminal

OUT = Path(__file__).parent / "histories"


async def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    server = DevServer(tmp / "t", port=free_port(), ui_port=None)
    server.start()
    await server.wait_ready_async(timeout=60)
    stack = Stack(tmp, server.address, cap=2, sim=SimConfig(model_names=[], latency_ms=50))
    await stack.start()
    try:
        client = stack.client()
        auth = {"Authorization": f"Bearer {API_KEY}"}
        done = await submit(stack, 30, prefix="done")
        async with httpx.AsyncClient(headers=auth) as http:
            await http.post(f"{stack.api_url}/v1/batches/{done}/pause")
            await asyncio.sleep(1)
            await http.post(f"{stack.api_url}/v1/batches/{done}/resume")
        await wait_terminal(client, done)
        cancelled = await submit(stack, 200, prefix="cancel")
        await asyncio.sleep(1)
        await client.batches.cancel(cancelled)
        await wait_terminal(client, cancelled)
        bad = await client.files.create(file=("bad.jsonl", b"not json\n"), purpose="batch")
        failed = await client.batches.create(
            input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        await wait_terminal(client, failed.id)
        assert jsonl  # keep the import for callers that extend this script
        temporal = await connect_client(server.address)
        OUT.mkdir(exist_ok=True)
        for name, wf_id in (
            ("batch_completed_paused", done),
            ("batch_cancelled", cancelled),
            ("batch_failed_validation", failed.id),
            ("route_scheduler", scheduler_workflow_id(stack.route_id)),
        ):
            history = await temporal.get_workflow_handle(wf_id).fetch_history()
            (OUT / f"{name}.json").write_text(history.to_json())
            print(f"saved {name}: {len(history.events)} events")
    finally:
        await stack.stop()
        server.stop()


async def continue_as_new() -> None:
    """First runs of a batch and of a scheduler that continued as new."""
    tmp = Path(tempfile.mkdtemp())
    server = DevServer(
        tmp / "t",
        port=free_port(),
        ui_port=None,
        dynamic_config={"limit.historyCount.suggestContinueAsNew": 60},
    )
    server.start()
    await server.wait_ready_async(timeout=60)
    stack = Stack(tmp, server.address, cap=1, sim=SimConfig(model_names=[], latency_ms=60))
    await stack.start()
    try:
        # Three workspaces contend for one slot: shares rotate, so the scheduler's history grows.
        batch_id = await submit(stack, 60, prefix="can")
        others = [
            (key, await submit(stack, 60, key=key, prefix=key[-5:]))
            for key in ("sk-test-beta", "sk-test-gamma")
        ]
        for key, b in [("sk-test-alpha", batch_id), *others]:
            await wait_terminal(stack.client(key), b)
        temporal = await connect_client(server.address)
        for name, wf_id in (
            ("batch_continued_as_new", batch_id),
            ("route_scheduler_continued_as_new", scheduler_workflow_id(stack.route_id)),
        ):
            runs = [
                ex
                async for ex in temporal.list_workflows(
                    f"WorkflowId = '{wf_id}' AND ExecutionStatus = 'ContinuedAsNew'"
                )
            ]
            assert runs, f"{wf_id} never continued as new"
            first = min(runs, key=lambda ex: ex.start_time)
            history = await temporal.get_workflow_handle(wf_id, run_id=first.run_id).fetch_history()
            (OUT / f"{name}.json").write_text(history.to_json())
            print(f"saved {name}: {len(history.events)} events")
    finally:
        await stack.stop()
        server.stop()


def expiry() -> None:
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "tests/workflows/test_expiry.py", "-k", "24h"],
        check=True,
        env={**os.environ, "BACKFILL_RECORD_HISTORIES": "1"},
    )
    print("saved batch_expired")


if __name__ == "__main__":
    asyncio.run(main())
    asyncio.run(continue_as_new())
    expiry()
