"""Preemptive yield's workers are found, not listed (issue 34, item 3): a worker started after
the api registers itself (its channel's address in its identity on the task queue), the api
finds it within seconds and sends it live counts, and it preempts, with no list edited."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import httpx

from tests.conftest import TemporalServer
from tests.e2e.stack import Stack, submit
from tests.e2e.test_live_gates import batch_arrivals, put_settings, scheduling, worker_samples
from tests.e2e.test_preempt_door import live_streams
from tests.polling import poll_until
from tools.sim import SimConfig


async def test_a_worker_started_after_the_api_is_found_and_preempts(
    tmp_path: Path, dev_server: TemporalServer
) -> None:
    sim = SimConfig(model_names=[], latency_ms=3000, stream_token_delay_ms=200)
    stack = Stack(
        tmp_path, dev_server.address, cap=3, sim=sim, preempt_token="e2e-found-" + "f" * 32
    )
    async with stack.running(workers=0), httpx.AsyncClient(timeout=30) as http:
        assert "BACKFILL_PREEMPT_WORKER_URLS" not in stack.env()  # no list anywhere
        # No worker yet: the route's status says the channel reaches none.
        doc = await scheduling(stack, http)
        assert doc["status"]["preempt_channel"] == {"workers_found": 0, "workers_reached": 0}
        stack.start_worker()  # after the api, on a port no list names
        await put_settings(
            stack,
            http,
            {
                "max_concurrent_lines": 3,
                "seat_aware": {"seats": 3, "keep_free": 0},
                "preempt": {"max_preemptions": 100},
            },
        )
        # The worker reads the route's policy; the api finds the worker and reports to it.
        await poll_until(
            lambda: worker_samples(stack, "gateway_preempt_on"),
            lambda s: s.get(stack.route_id) == 1,
            timeout=30,
            what="the worker reading the route's preemption on",
            interval=0.2,
            ignore=(httpx.HTTPError,),
        )
        await poll_until(
            lambda: worker_samples(stack, "gateway_preempt_reporting_processes"),
            lambda s: s.get(stack.route_id, 0) >= 1,
            timeout=30,
            what="the api finding the worker and sending it live counts",
            interval=0.2,
        )
        doc = await poll_until(
            lambda: scheduling(stack, http),
            lambda d: d["status"]["preempt_channel"]["workers_reached"] == 1,
            timeout=15,
            what="the route's status counting the worker reached",
            interval=0.2,
        )
        assert doc["status"]["preempt_channel"]["workers_found"] == 1
        batch_id = await submit(stack, 30, prefix="found")
        await poll_until(
            lambda: len(batch_arrivals(stack)),
            lambda n: n >= 3,
            timeout=30,
            what="three batch lines upstream (every shared seat)",
        )
        live = asyncio.ensure_future(live_streams(stack.client()))
        try:
            await poll_until(
                lambda: scheduling(stack, http),
                lambda d: d["status"]["preempted_lines"] > 0,
                timeout=15,
                what="a batch line preempted for the live stream",
                interval=0.2,
            )
        finally:
            live.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await live
        await stack.client().batches.cancel(batch_id)
