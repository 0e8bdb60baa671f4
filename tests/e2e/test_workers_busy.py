"""Lines allotted but not started because the workers have no free activity slot are shown as
"Gateway batch workers busy", not blamed on the route."""

from __future__ import annotations

from typing import Any

from tests.e2e.conftest import MakeStack
from tests.e2e.stack import submit, wait_in_flight
from tests.polling import poll_until
from tools.sim import SimConfig


async def test_allotted_lines_waiting_for_worker_slots_say_so(make_stack: MakeStack) -> None:
    stack = await make_stack(
        cap=4,
        sim=SimConfig(model_names=[], latency_ms=1500),
        # The route allows 4 lines, the one worker runs only 2 activities at once.
        extra_env={"BACKFILL_WORKER_MAX_CONCURRENT_ACTIVITIES": "2"},
    )
    first = await submit(stack, 40, key="sk-test-alpha", prefix="a")
    # The first batch fills both worker slots with slow lines...
    await wait_in_flight(stack, 2)  # both worker slots busy
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
