"""An upstream that closes idle keep-alive connections never fails a line.

The simulator closes a keep-alive connection after 1 s idle (vLLM and uvicorn: 5 s). Lines are
spaced so the worker's pooled connections go idle about that long: now and then the upstream
answers 429, and the route then starts no line for 1 s (its first backoff) while the lines in
flight (300 ms each) finish; when lines start again, they reuse connections idle for about 1 s,
some of which the server is closing right then. The simulator shares this test's event loop,
kept busy (a few ms per turn, like a loaded model server's), so the server closes a connection
only after the request has already gone out on it: the client gets a reset or an EOF instead of
an answer. Such a request was never answered: it is sent again and no line fails.

The race is a race: without the resend this lost a line in some runs, not in all; the rule
itself is pinned by tests/unit/test_run_line.py."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from tests.e2e.stack import Stack, output_ids, submit, wait_terminal
from tools.sim import SimConfig
from tools.sim.faults import SimFault

LINES = 240
IDLE_CLOSE_S = 1.0
BUSY_TURN_S = 0.005


async def busy_loop() -> None:
    """Hold the event loop (the simulator's) a few ms per turn, as a loaded server does."""
    while True:
        time.sleep(BUSY_TURN_S)  # noqa: ASYNC251 (blocking on purpose: a busy server)
        await asyncio.sleep(0)


@pytest_asyncio.fixture(loop_scope="session")
async def idle_closing_stack(tmp_path: Path, dev_server) -> AsyncIterator[Stack]:  # type: ignore[no-untyped-def]
    sim = SimConfig(
        model_names=[],
        latency_ms=300,
        timeout_keep_alive_s=IDLE_CLOSE_S,
        faults=[SimFault(status=429, rate=0.08)],  # each 429: the route pauses about 1 s
    )
    async with Stack(tmp_path, dev_server.address, cap=16, sim=sim).running() as stack:
        yield stack


async def test_idle_closed_connections_fail_no_line(idle_closing_stack: Stack) -> None:
    stack = idle_closing_stack
    client = stack.client()
    batch_id = await submit(stack, LINES)
    busy = asyncio.ensure_future(busy_loop())
    try:
        batch = await wait_terminal(client, batch_id, within=300)
    finally:
        busy.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await busy
    ids, errors = await output_ids(client, batch)
    assert errors == [], errors[:3]
    assert batch.status == "completed"
    assert sorted(ids) == sorted(f"req-{i}" for i in range(LINES))
    assert batch.request_counts.completed == LINES and batch.request_counts.failed == 0
