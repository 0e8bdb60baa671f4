"""A worker killed with SIGKILL mid-batch loses nothing and duplicates nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from backfill.sim import SimConfig
from tests.e2e.stack import Stack, input_ids, output_ids, submit, wait_terminal
from tests.polling import poll_until


@pytest_asyncio.fixture(loop_scope="session")
async def slow_stack(tmp_path: Path, dev_server) -> AsyncIterator[Stack]:  # type: ignore[no-untyped-def]
    s = Stack(tmp_path, dev_server.address, cap=4, sim=SimConfig(model_names=[], latency_ms=300))
    async with s.running():
        yield s


async def test_sigkill_worker_mid_batch_completes_exactly_once(slow_stack: Stack) -> None:
    stack = slow_stack
    client = stack.client()
    n = 60
    batch_id = await submit(stack, n)
    # Wait until lines are in flight on the upstream, then kill the worker without warning.
    await poll_until(
        lambda: stack.sim.app.stats_dict()["batch"]["concurrent"],
        lambda c: c >= 4,
        timeout=120,
        what="4 lines in flight at the upstream",
        interval=0.05,
    )
    before = (await client.batches.retrieve(batch_id)).request_counts
    assert before is not None and before.completed < n
    assert stack.workers[0].kill() == -9
    stack.start_worker()
    batch = await wait_terminal(client, batch_id, within=180)
    assert batch.status == "completed", batch
    ids, errors = await output_ids(client, batch)
    assert errors == []
    assert ids == input_ids("req", n)  # each exactly once, in input order
    assert batch.request_counts.completed == n and batch.request_counts.failed == 0
