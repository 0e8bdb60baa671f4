"""Pause, resume and cancel through the API and as plain Temporal signals from the CLI,
each checked in the output files."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest_asyncio

from tests.e2e.stack import (
    Stack,
    assert_input_order,
    input_ids,
    output_ids,
    submit,
    wait_terminal,
)
from tests.polling import poll_until
from tools.dev.devserver import temporal_cli_path
from tools.sim import SimConfig

AUTH = {"Authorization": "Bearer sk-test-alpha"}
LATENCY_MS = 150


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def ctl_stack(tmp_path_factory, dev_server) -> AsyncIterator[Stack]:  # type: ignore[no-untyped-def]
    s = Stack(
        tmp_path_factory.mktemp("controls"),
        dev_server.address,
        cap=2,
        sim=SimConfig(model_names=[], latency_ms=LATENCY_MS),
    )
    async with s.running():
        yield s


async def post(stack: Stack, batch_id: str, action: str) -> httpx.Response:
    async with httpx.AsyncClient(headers=AUTH) as http:
        return await http.post(f"{stack.api_url}/v1/batches/{batch_id}/{action}")


async def get(stack: Stack, batch_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(headers=AUTH) as http:
        r = await http.get(f"{stack.api_url}/v1/batches/{batch_id}")
        assert r.status_code == 200
        return r.json()  # type: ignore[no-any-return]


async def wait_completed_at_least(stack: Stack, batch_id: str, n: int) -> None:
    await poll_until(
        lambda: get(stack, batch_id),
        lambda b: b["request_counts"]["completed"] >= n,
        timeout=120,
        what=f"batch {batch_id} to complete {n} lines",
    )


async def wait_drained(stack: Stack, batch_id: str) -> dict[str, Any]:
    """Paused: wait until the lines that were running have finished."""
    return await poll_until(
        lambda: get(stack, batch_id),
        lambda b: all(r["running_lines"] == 0 for r in b["backfill"]["routes"]),
        timeout=120,
        what=f"paused batch {batch_id} to have no running line",
    )


def in_flight(stack: Stack, batch_id: str) -> int:
    return int(stack.sim.app.stats_dict()["batch"]["by_batch"].get(batch_id, 0))


async def test_pause_and_resume_through_the_api(ctl_stack: Stack) -> None:
    stack = ctl_stack
    batch_id = await submit(stack, 30, prefix="pr")
    await wait_completed_at_least(stack, batch_id, 2)
    r = await post(stack, batch_id, "pause")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "in_progress"  # OpenAI's status does not change
    assert body["backfill"]["paused"] is True and body["backfill"]["paused_by"] == "alpha-key"
    # Pausing twice: still paused, by the first pauser.
    again = await post(stack, batch_id, "pause")
    assert again.status_code == 200 and again.json()["backfill"]["paused_by"] == "alpha-key"
    paused = await wait_drained(stack, batch_id)
    assert paused["backfill"]["summary"] == "Paused"
    # A paused batch holds no allotment: its slots go back to the route (the scheduler's revoke
    # reaches the batch by signal, so it may land just after the last line finished).
    paused = await poll_until(
        lambda: get(stack, batch_id),
        lambda b: all(r["allotment"] == 0 for r in b["backfill"]["routes"]),
        timeout=60,
        what=f"paused batch {batch_id} to give its allotment back",
    )
    sent = in_flight(stack, batch_id)
    done = paused["request_counts"]["completed"]
    assert done < 30
    # Nothing is sent while paused: watched for ten upstream latencies (a line started after
    # the pause would reach the simulator, or complete, well within that), the upstream count
    # and the counters stand still while the batch's own workflow answers many times over.
    watch_until = time.monotonic() + 10 * LATENCY_MS / 1000
    answers = 0
    while time.monotonic() < watch_until:
        b = await get(stack, batch_id)
        assert b["request_counts"]["completed"] == done and in_flight(stack, batch_id) == sent
        answers += 1
        await asyncio.sleep(0.05)
    assert answers >= 3, answers
    r = await post(stack, batch_id, "resume")
    assert r.status_code == 200 and r.json()["backfill"]["paused"] is False
    # Resuming a batch that runs is a no-op.
    assert (await post(stack, batch_id, "resume")).status_code == 200
    client = stack.client()
    batch = await wait_terminal(client, batch_id, within=120)
    assert batch.status == "completed"
    ids, errors = await output_ids(client, batch)
    assert ids == input_ids("pr", 30) and errors == []
    # Pausing or resuming a finished batch is refused.
    for action in ("pause", "resume", "cancel"):
        r = await post(stack, batch_id, action)
        assert r.status_code == 409, (action, r.text)
        assert r.json()["error"]["code"] == "invalid_batch_status"


async def test_cancel_a_paused_batch_keeps_partial_results(ctl_stack: Stack) -> None:
    stack = ctl_stack
    batch_id = await submit(stack, 25, prefix="cx")
    await wait_completed_at_least(stack, batch_id, 3)
    assert (await post(stack, batch_id, "pause")).status_code == 200
    r = await post(stack, batch_id, "cancel")
    assert r.status_code == 200
    assert r.json()["status"] == "cancelling" and r.json()["cancelling_at"]
    client = stack.client()
    batch = await wait_terminal(client, batch_id, within=60)
    assert batch.status == "cancelled" and batch.cancelled_at and batch.cancelling_at
    ids, errors = await output_ids(client, batch)
    cancelled = [e["custom_id"] for e in errors if e["error"]["code"] == "batch_cancelled"]
    assert len(ids) >= 3 and len(ids) + len(cancelled) == 25 == len(errors) + len(ids)
    assert sorted(ids + cancelled) == sorted(input_ids("cx", 25))
    assert_input_order(ids, input_ids("cx", 25))
    assert_input_order(cancelled, input_ids("cx", 25))
    for e in errors:
        assert e["response"] is None
        assert e["error"]["message"].startswith("This request was not executed")
    assert batch.request_counts.completed == len(ids)
    assert batch.request_counts.failed == len(cancelled)
    assert batch.request_counts.total == 25


async def test_pause_resume_and_cancel_as_temporal_signals_from_the_cli(ctl_stack: Stack) -> None:
    stack = ctl_stack
    batch_id = await submit(stack, 20, prefix="cli")
    await wait_completed_at_least(stack, batch_id, 2)

    def signal(name: str) -> None:
        subprocess.run(
            [
                str(temporal_cli_path()),
                "workflow",
                "signal",
                "--address",
                stack.temporal_address,
                "--workflow-id",
                batch_id,
                "--name",
                name,
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )

    await asyncio.to_thread(signal, "pause")
    paused = await wait_drained(stack, batch_id)
    assert paused["backfill"]["paused"] is True
    assert paused["backfill"]["paused_by"] == "operator"
    assert paused["status"] == "in_progress"
    await asyncio.to_thread(signal, "resume")
    client = stack.client()
    batch = await wait_terminal(client, batch_id, within=120)
    assert batch.status == "completed"
    ids, errors = await output_ids(client, batch)
    assert ids == input_ids("cli", 20) and errors == []
    # Cancel, also a plain signal: running lines finish, the rest become batch_cancelled.
    batch_id = await submit(stack, 30, prefix="clicx")
    await wait_completed_at_least(stack, batch_id, 2)
    await asyncio.to_thread(signal, "cancel")
    batch = await wait_terminal(client, batch_id, within=120)
    assert batch.status == "cancelled"
    ids, errors = await output_ids(client, batch)
    assert len(ids) >= 2 and {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert sorted(ids + [e["custom_id"] for e in errors]) == sorted(input_ids("clicx", 30))
    assert_input_order(ids, input_ids("clicx", 30))
    assert_input_order([e["custom_id"] for e in errors], input_ids("clicx", 30))


async def test_deleting_the_input_file_does_not_break_a_running_batch(ctl_stack: Stack) -> None:
    stack = ctl_stack
    client = stack.client()
    batch_id = await submit(stack, 20, prefix="del")
    await wait_completed_at_least(stack, batch_id, 2)
    batch = await client.batches.retrieve(batch_id)
    deleted = await client.files.delete(batch.input_file_id)
    assert deleted.deleted
    batch = await wait_terminal(client, batch_id, within=120)
    assert batch.status == "completed"  # the batch runs from its own pinned copy
    ids, errors = await output_ids(client, batch)
    assert ids == input_ids("del", 20) and errors == []


async def test_temporal_workflow_cancel_keeps_partial_results(ctl_stack: Stack) -> None:
    """The Temporal UI's Cancel button (a workflow cancellation request) cancels the batch the
    same way as the signal: running lines finish and the files are assembled."""
    stack = ctl_stack
    client = stack.client()
    batch_id = await submit(stack, 30, prefix="wfcx")
    await wait_completed_at_least(stack, batch_id, 2)
    await asyncio.to_thread(
        subprocess.run,
        [
            str(temporal_cli_path()),
            "workflow",
            "cancel",
            "--address",
            stack.temporal_address,
            "--workflow-id",
            batch_id,
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    batch = await wait_terminal(client, batch_id, within=120)
    assert batch.status == "cancelled" and batch.cancelled_at
    ids, errors = await output_ids(client, batch)
    assert len(ids) >= 2 and {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert sorted(ids + [e["custom_id"] for e in errors]) == sorted(input_ids("wfcx", 30))
    assert_input_order(ids, input_ids("wfcx", 30))
    assert_input_order([e["custom_id"] for e in errors], input_ids("wfcx", 30))
