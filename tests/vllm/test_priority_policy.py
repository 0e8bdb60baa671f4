"""`priority` under vLLM's `--scheduling-policy priority` (the simulator's `scheduling_policy`),
in a module of its own: it runs after the rest, so vLLM restarts with that policy only once."""

from __future__ import annotations

from tests.vllm.test_contract import _first_admitted
from tests.vllm.upstreams import Upstream


async def test_priority_orders_the_queue_under_the_priority_policy(
    priority_upstream: Upstream,
) -> None:
    """With `--scheduling-policy priority` a lower value is served first."""
    assert await _first_admitted(priority_upstream) == "urgent"
