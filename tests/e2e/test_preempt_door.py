"""Preemptive yield's door on the real stack: a line the workers hold back is never lost.

A route whose live-latency target live traffic cannot meet has every shared seat held back by
the workers (docs/decisions/0025). Its batch lines must wait for live traffic to calm down, as
long as it takes, and then complete: waiting is not a try, so no line may time out, count as
lost, or end `line_lost` (issue 34, item 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import TemporalServer
from tests.e2e.stack import Stack, input_ids, output_ids, submit, wait_terminal
from tests.e2e.test_live_gates import held_back, put_settings, scheduling
from tests.polling import poll_until
from tests.workflows.events import E
from tools.sim import SimConfig

LINE_TIMEOUT = 7.0
"""The batch's line timeout (s): its activity's clock is this + 60 s, so 10× it (70 s) is past
the clock a line waiting at the door ran on before."""
HOLD = 10 * LINE_TIMEOUT


async def live_streams(client: Any) -> None:
    """One live stream in flight at a time (its first token ~1 s late), until cancelled."""
    while True:
        stream = await client.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "live"}], stream=True
        )
        async for _ in stream:
            pass


async def test_a_line_held_back_ten_line_timeouts_is_not_lost_and_completes(
    tmp_path: Path, dev_server: TemporalServer
) -> None:
    sim = SimConfig(model_names=[], latency_ms=1000, stream_token_delay_ms=50)
    stack = Stack(
        tmp_path,
        dev_server.address,
        cap=2,
        sim=sim,
        preempt_token="e2e-preempt-" + "p" * 32,
        limits={"line_timeout_seconds": LINE_TIMEOUT},
    )
    async with stack.running(), httpx.AsyncClient(timeout=30) as http:
        # Two shared seats (3 − 1 kept free); a live TTFT target of 1 ms no stream can meet:
        # the workers hold both back while live traffic lasts.
        await put_settings(
            stack,
            http,
            {
                "max_concurrent_lines": 2,
                "seat_aware": {"seats": 3, "keep_free": 1},
                "preempt": {"max_preemptions": 100, "live_ttft_target_ms": 1},
            },
        )
        client = stack.client()
        live = asyncio.ensure_future(live_streams(client))
        try:
            await poll_until(
                lambda: held_back(stack, http),
                lambda n: n == 2,
                timeout=30,
                what="the worker holding both shared seats back",
                interval=0.2,
            )
            batch_id = await submit(stack, 3, prefix="held")
            # The scenario itself: live traffic that keeps every shared seat held back for ten
            # line timeouts (not a wait for a race: nothing is polled here).
            held_until = time.monotonic() + HOLD
            while time.monotonic() < held_until:
                assert not live.done(), "the live traffic stopped early"
                await asyncio.sleep(1)
            status = (await scheduling(stack, http))["status"]
        finally:
            live.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await live
        batch = await wait_terminal(client, batch_id, within=120)
        assert batch.status == "completed", batch
        assert batch.request_counts.completed == 3 and batch.request_counts.failed == 0, batch
        ids, errors = await output_ids(client, batch)
        assert sorted(ids) == input_ids("held", 3) and errors == []
    # No line's activity ran out of its clock (each such time-out was a lost try: five of them
    # end the line `line_lost` without it ever being sent).
    temporal = await dev_server.client()
    history = await temporal.get_workflow_handle(batch_id).fetch_history()
    timed_out = [e for e in history.events if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT]
    assert timed_out == [], f"{len(timed_out)} line activities timed out while held back"
    # While the seats were held back, the route's scheduler knew: it allotted no line.
    assert status["seats_held_back"] == 2, status
    assert [b["allotment"] for b in status["batches"]] == [0], status
