"""Heartbeating while an activity waits, so a dead worker is noticed (heartbeat timeout)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio import activity

HEARTBEAT_EVERY = 4.0
"""Seconds between heartbeats; well under every activity's heartbeat timeout (lines: 10 s).
A line answered sooner never heartbeats: at 2 s lines and 256 in flight, a heartbeat per line
was a server call per line (about 128/s) that the bare baseline does not pay."""


@contextlib.asynccontextmanager
async def heartbeating() -> AsyncIterator[None]:
    """Heartbeat every few seconds while the body waits.

    Not at once: a heartbeat per short line would be a server write per line."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_EVERY)
            activity.heartbeat()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
