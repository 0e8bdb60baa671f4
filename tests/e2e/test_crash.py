"""A worker killed with SIGKILL mid-batch loses nothing and duplicates nothing."""

from __future__ import annotations

from backfill.sim import SimConfig
from tests.e2e.conftest import MakeStack
from tests.e2e.stack import input_ids, output_ids, submit, wait_in_flight, wait_terminal


async def test_sigkill_worker_mid_batch_completes_exactly_once(make_stack: MakeStack) -> None:
    stack = await make_stack(cap=4, sim=SimConfig(model_names=[], latency_ms=300))
    client = stack.client()
    n = 60
    batch_id = await submit(stack, n)
    # Wait until lines are in flight on the upstream, then kill the worker without warning.
    await wait_in_flight(stack, 4)
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
