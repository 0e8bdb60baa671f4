"""Preemption is exact with several workers (issue 34, item 2): the workers tell each other
their lines upstream, so a live request that needs one seat ends exactly one batch line
route-wide, wherever the lines run."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.conftest import TemporalServer
from tests.e2e.stack import Stack, submit
from tests.e2e.test_live_gates import batch_arrivals, put_settings, scheduling, worker_samples
from tests.polling import poll_until
from tools.sim import SimConfig

WORKERS = 3


async def test_one_live_request_ends_exactly_one_line_across_three_workers(
    tmp_path: Path, dev_server: TemporalServer
) -> None:
    sim = SimConfig(model_names=[], latency_ms=6000, stream_token_delay_ms=100)
    # No eager activities: each line goes through the task queue, so the three workers share
    # the lines (eagerly, a batch's lines start on the worker that runs its workflow task).
    stack = Stack(
        tmp_path,
        dev_server.address,
        cap=3,
        sim=sim,
        preempt_token="e2e-workers-" + "w" * 32,
        extra_env={"BACKFILL_WORKER_EAGER_ACTIVITIES": "0"},
    )
    async with stack.running(workers=WORKERS), httpx.AsyncClient(timeout=30) as http:
        await put_settings(
            stack,
            http,
            {
                "max_concurrent_lines": 3,
                "seat_aware": {"seats": 3, "keep_free": 0},
                "preempt": {"max_preemptions": 100},
            },
        )
        for i in range(WORKERS):  # each reads the policy, hears the api, knows the others
            await poll_until(
                lambda i=i: worker_samples(stack, "gateway_preempt_on", i),
                lambda s: s.get(stack.route_id) == 1,
                timeout=30,
                what=f"worker {i} reading the route's preemption on",
                interval=0.2,
            )
            await poll_until(
                lambda i=i: worker_samples(stack, "gateway_preempt_reporting_processes", i),
                lambda s: s.get(stack.route_id, 0) >= 1,
                timeout=30,
                what=f"worker {i} hearing the api's live counts",
                interval=0.2,
            )
            await poll_until(
                lambda i=i: worker_samples(stack, "gateway_preempt_peer_workers", i),
                lambda s: s.get("", 0) == WORKERS - 1,
                timeout=30,
                what=f"worker {i} finding the other two",
                interval=0.2,
            )
        batch_id = await submit(stack, 30, prefix="exact")
        await poll_until(
            lambda: len(batch_arrivals(stack)),
            lambda n: n >= 3,
            timeout=30,
            what="three batch lines upstream (every shared seat)",
        )
        # One live request: it needs one of the three seats, so exactly one line ends.
        stream = await stack.client().chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "live"}], stream=True
        )
        async for _ in stream:
            pass
        await poll_until(
            lambda: scheduling(stack, http),
            lambda d: d["status"]["preempted_lines"] >= 1,
            timeout=10,
            what="a batch line preempted for the live request",
            interval=0.2,
        )
        # None twice, never more than needed: a second would show within the stream's life.
        status = (await scheduling(stack, http))["status"]
        assert status["preempted_lines"] == 1, status
        await stack.client().batches.cancel(batch_id)
