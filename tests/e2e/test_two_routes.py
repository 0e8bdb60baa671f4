"""A model with two routes: lines are split at validation and each route progresses under its
own scheduler and cap; a full route never spills onto the other."""

from __future__ import annotations

from typing import Any

import httpx

from tests.e2e.conftest import MakeStack
from tests.e2e.stack import input_ids, output_ids, submit, watch_until_terminal
from tools.sim import SimConfig


async def test_each_route_runs_its_own_lines_under_its_own_cap(make_stack: MakeStack) -> None:
    stack = await make_stack(
        cap=4,
        extra_routes=1,
        sim=SimConfig(model_names=[], latency_ms=100),
        sim_per_route=True,  # each route's concurrency is measured at its own upstream
    )
    fast, slow = stack.routes
    admin = {"Authorization": "Bearer sk-test-admin"}
    async with httpx.AsyncClient(headers=admin) as http:
        url = f"{stack.api_url}/api/v1/platform/deployments/{slow}/batch-scheduling"
        assert (await http.put(url, json={"max_concurrent_lines": 1})).status_code == 200
    client = stack.client()
    batch_id = await submit(stack, 60, prefix="two")
    peak: dict[str, int] = {fast: 0, slow: 0}
    totals: dict[str, int] = {}

    def sample(b: Any) -> None:
        for r in (b.model_extra or {})["backfill"]["routes"]:
            peak[r["route"]] = max(peak[r["route"]], r["running_lines"])
            totals[r["route"]] = r["total_lines"]

    b = await watch_until_terminal(client, batch_id, sample, within=240, interval=0.05)
    assert b.status == "completed"
    # Lines were split between both routes at validation (weights 1:1) and stayed there.
    assert totals[fast] > 10 and totals[slow] > 10 and totals[fast] + totals[slow] == 60
    for r in (b.model_extra or {})["backfill"]["routes"]:
        assert r["finished_lines"] == r["total_lines"]
    # Measured at each route's own upstream: the slow route's cap of 1 held, the other route
    # used more than one of its own four slots meanwhile, and each upstream got its own lines.
    upstream = {r: stack.route_sims[r].app.stats_dict()["batch"] for r in (fast, slow)}
    assert upstream[slow]["peak_concurrent"] == 1, upstream
    assert 1 < upstream[fast]["peak_concurrent"] <= 4, upstream
    for r in (fast, slow):
        assert upstream[r]["by_batch"][batch_id] >= totals[r], (r, upstream)
    # The batch's own report agrees.
    assert peak[slow] == 1 and peak[fast] > 1
    ids, errors = await output_ids(client, b)
    assert ids == input_ids("two", 60) and errors == []
