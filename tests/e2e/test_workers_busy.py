"""Lines allotted but not started because the workers have no free activity slot are shown as
"Gateway batch workers busy", not blamed on the route."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from backfill.sim import SimConfig
from tests.e2e.stack import Stack, submit
from tests.polling import poll_until


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
    await poll_until(
        lambda: stack.sim.app.stats_dict()["batch"]["concurrent"],
        lambda c: c >= 2,
        timeout=120,
        what="both worker slots busy at the upstream",
        interval=0.05,
    )
    # ...so a second workspace's batch gets an allotment its lines cannot start on.
    second = await submit(stack, 10, key="sk-test-beta", prefix="b")
    client = stack.client("sk-test-beta")
    reasons: set[str | None] = set()

    async def allotted_reasons() -> dict[str, Any]:
        b = await client.batches.retrieve(second)
        ext: dict[str, Any] = (b.model_extra or {})["backfill"]
        reasons.update(r["reason"] for r in ext["routes"] if r["allotment"] > 0)
        return ext

    ext = await poll_until(
        allotted_reasons,
        lambda _: "Gateway batch workers busy" in reasons,
        timeout=60,
        what="an allotted line shown as 'Gateway batch workers busy'",
    )
    assert ext["summary"] == "Queued — waiting for capacity"
    for batch_id, key in ((first, "sk-test-alpha"), (second, "sk-test-beta")):
        await stack.client(key).batches.cancel(batch_id)
