"""A worker killed with SIGKILL mid-batch loses nothing and duplicates nothing, and its lines run
again on the other worker within the heartbeat timeout and the sticky-queue wait."""

from __future__ import annotations

from backfill.platform.config import Limits, Settings
from tests.e2e.conftest import MakeStack
from tests.e2e.crash import kill_and_time_recovery
from tests.e2e.stack import input_ids, output_ids, submit, wait_in_flight, wait_terminal
from tools.dev.devserver import connect_client
from tools.sim import SimConfig

SLACK_SECONDS = 6.0
"""Beyond the heartbeat timeout and the sticky-queue wait: the server's timer, the workflow task
that requeues the lines, the other worker's poll (seconds on a loaded CI machine)."""


async def test_sigkill_worker_mid_batch_completes_exactly_once(make_stack: MakeStack) -> None:
    stack = await make_stack(workers=2, cap=4, sim=SimConfig(model_names=[], latency_ms=1500))
    client = stack.client()
    n = 40
    batch_id = await submit(stack, n)
    # Wait until lines are in flight on the upstream, then kill a worker without warning.
    await wait_in_flight(stack, 4)
    before = (await client.batches.retrieve(batch_id)).request_counts
    assert before is not None and before.completed < n
    temporal = await connect_client(stack.temporal_address)
    recovery = await kill_and_time_recovery(temporal, batch_id, stack.workers, "busiest")
    assert recovery.lost_lines >= 1
    bound = (
        Limits().line_heartbeat_timeout_seconds
        + Settings.model_fields["worker_sticky_queue_timeout_seconds"].default
        + SLACK_SECONDS
    )
    assert recovery.last_running_again_s is not None
    assert recovery.last_running_again_s <= bound, recovery
    batch = await wait_terminal(client, batch_id, within=180)
    assert batch.status == "completed", batch
    ids, errors = await output_ids(client, batch)
    assert errors == []
    assert ids == input_ids("req", n)  # each exactly once, in input order
    assert batch.request_counts.completed == n and batch.request_counts.failed == 0
