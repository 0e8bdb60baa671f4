"""Lines allotted but not started because the workers have no free activity slot are shown as
"Gateway batch workers busy", not blamed on the route."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from backfill.sim import SimConfig
from tests.e2e.stack import Stack, submit


@pytest_asyncio.fixture(loop_scope="session")
async def small_worker(tmp_path: Path, dev_server) -> AsyncIterator[Stack]:  # type: ignore[no-untyped-def]
    s = Stack(
        tmp_path,
        dev_server.address,
        cap=4,
        sim=SimConfig(model_names=[], latency_ms=1500),
        # The route allows 4 lines, the one worker runs only 2 activities at once.
        extra_env={"BACKFILL_WORKER_MAX_CONCURRENT_ACTIVITIES": "2"},
    )
    async with s.running():
        yield s


async def test_allotted_lines_waiting_for_worker_slots_say_so(small_worker: Stack) -> None:
    stack = small_worker
    first = await submit(stack, 40, key="sk-test-alpha", prefix="a")
    # The first batch fills both worker slots with slow lines...
    while stack.sim.app.stats_dict()["batch"]["concurrent"] < 2:
        await asyncio.sleep(0.05)
    # ...so a second workspace's batch gets an allotment its lines cannot start on.
    second = await submit(stack, 10, key="sk-test-beta", prefix="b")
    client = stack.client("sk-test-beta")
    reasons: set[str | None] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "Gateway batch workers busy" not in reasons:
        b = await client.batches.retrieve(second)
        ext = (b.model_extra or {})["backfill"]
        reasons |= {r["reason"] for r in ext["routes"] if r["allotment"] > 0}
        await asyncio.sleep(0.1)
    assert "Gateway batch workers busy" in reasons, reasons
    assert ext["summary"] == "Queued — waiting for capacity"
    for batch_id, key in ((first, "sk-test-alpha"), (second, "sk-test-beta")):
        await stack.client(key).batches.cancel(batch_id)
